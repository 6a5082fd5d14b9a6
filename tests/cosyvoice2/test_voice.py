"""CosyVoice2 sessions on the scheduler's interface: the same audio as the model's own streaming, the hop
schedule, the modes' LM and flow inputs, segments, and streams that do not disturb each other."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")
require("kaldi_native_fbank")

# These import torch or onnx (the cosyvoice extra), so they follow require(): without it the module is skipped.
from rtvoice.engine.models.cosyvoice2.frontend import END_OF_PROMPT  # noqa: E402 (cosyvoice extra)
from rtvoice.engine.models.cosyvoice2.steps import PrefillJob  # noqa: E402 (cosyvoice extra)
from rtvoice.engine.models.cosyvoice2.voice import CosyVoice2Session  # noqa: E402 (cosyvoice extra)
from tests.cosyvoice2.sizes import expected_chunk_samples, most_tokens, samples_per_token  # noqa: E402 (cosyvoice extra)
from tests.cosyvoice2.standins import tone_wav  # noqa: E402 (cosyvoice extra)


@pytest.fixture
def deterministic_source(serving_service: Any) -> Iterator[None]:
    """Test-only: HiFT's sine source without its random phase and noise."""
    source = serving_service.model.hift.m_source
    source.random_source = False
    yield
    source.random_source = True


@pytest.fixture(scope="module")
def prompt(serving_service: Any) -> Any:
    return serving_service.prompt_features(serving_service.prompt_audio(tone_wav(2.2, 48000, 2)), "Hello there.")


def drive(session: CosyVoice2Session, texts: list[str]) -> tuple[list[np.ndarray], list[str], list[list[int]]]:
    """Run a session step by step as the scheduler would on one runner slot (one step at a time, a chunk whose
    tokens are there before the next LM step): audio chunks, step kinds, tokens."""
    for text in texts:
        session.add_segment(text)
    chunks, kinds, tokens = [], [], []
    while (step := session.concurrent_step() or session.next_step()) is not None:
        (result,) = session.voice.run([step.payload])
        kinds.append(step.kind)
        audio = session.complete(step, result)
        if step.kind == "lm" and isinstance(step.payload, PrefillJob):
            tokens.append([])
        if step.kind == "lm" and result.token is not None:
            tokens[-1].append(result.token)
        if audio is not None:
            chunks.append(audio)
    assert session.idle
    return chunks, kinds, tokens


@pytest.mark.parametrize("mode", ["sft", "zero_shot"])
def test_session_equals_model_streaming(
    serving_service: Any, prompt: Any, deterministic_source: None, mode: str
) -> None:
    """Driven step by step, a session makes exactly what the LM then the model's streaming token2wav make."""
    service = serving_service
    voice = service.speakers["cosyvoice2-sft"] if mode == "sft" else service.prompt_voice(prompt, "zero_shot")
    session = voice.open_session(SynthesisOptions(seed=5))
    chunks, kinds, (tokens,) = drive(session, ["Good."])
    assert kinds[0] == "lm" and "token2wav" in kinds

    text = torch.tensor([list(b"Good.")], dtype=torch.int32)
    lm = service.model.llm.start(
        text, voice.lm_prompt.text_ids, voice.lm_prompt.speech_tokens, generator=torch.Generator().manual_seed(5)
    )
    assert list(service.model.llm.generate(lm)) == tokens and len(tokens) == lm.max_len == most_tokens(service, "Good.")
    reference = service.model.token2wav.stream(voice.flow_prompt, torch.Generator().manual_seed(6))
    want = [c for t in tokens for c in reference.push([t])] + reference.finish()
    assert [len(c) for c in chunks] == [c.shape[1] for c in want]
    for got, expected in zip(chunks, want, strict=True):
        assert np.array_equal(got, expected[0].numpy())
    assert [len(c) for c in chunks] == expected_chunk_samples(service, len(tokens), voice.flow_prompt.tokens.shape[1])


def test_token2wav_steps_interleave_with_lm_steps(serving_service: Any) -> None:
    """Event-driven: a chunk runs as soon as its tokens are there, before the next token is decoded."""
    voice = serving_service.speakers["cosyvoice2-sft"]
    _, kinds, (tokens,) = drive(voice.open_session(SynthesisOptions(seed=1)), ["Hi."])
    first_chunk = kinds.index("token2wav")
    assert kinds[:first_chunk] == ["lm"] * (25 + 3)  # the prefill's token, then one per step
    assert kinds[first_chunk + 1] == "lm"  # decoding resumes after the chunk
    # one LM step per token; a stop token (not reached at the length limit) costs one more step
    assert kinds[-1] == "token2wav" and kinds.count("lm") == len(tokens) + (len(tokens) < 20 * 3)


def test_modes_feed_the_reference_inputs(serving_service: Any, prompt: Any) -> None:
    service = serving_service
    n_prompt = prompt.speech_tokens.shape[1]
    zero_shot = service.prompt_voice(prompt, "zero_shot")
    assert torch.equal(zero_shot.lm_prompt.text_ids, prompt.prompt_text_ids)
    assert torch.equal(zero_shot.lm_prompt.speech_tokens, prompt.speech_tokens)
    cross = service.prompt_voice(prompt, "cross_lingual")
    assert cross.lm_prompt.text_ids.shape == (1, 0) and cross.lm_prompt.speech_tokens.shape == (1, 0)
    instruct = service.prompt_voice(prompt, "instruct2", "Speak softly.")
    assert instruct.lm_prompt.text_ids.tolist() == [service.frontend.text_ids("Speak softly." + END_OF_PROMPT)]
    assert instruct.lm_prompt.speech_tokens.shape == (1, 0)
    for voice in (zero_shot, cross, instruct):  # the flow always gets the whole prompt
        assert voice.flow_prompt.tokens.shape == (1, n_prompt)
        assert voice.flow_prompt.feat.shape == (1, 2 * n_prompt, 80)
        assert torch.equal(voice.flow_prompt.embedding, prompt.embedding)
    sft = service.speakers["cosyvoice2-sft"]
    assert sft.mode == "sft" and sft.lm_prompt.text_ids.shape == (1, 0) and sft.flow_prompt.tokens.shape == (1, 0)
    saved = service.speakers["cosyvoice2-saved"]  # an add_zero_shot_spk entry: zero-shot with its own prompt
    assert saved.mode == "zero_shot" and saved.lm_prompt.text_ids.tolist() == [list(b"Saved prompt.")]
    # OpenAI's ``instructions`` turn any voice's request into instruct2 (the flow prompt stays the voice's).
    session = zero_shot.open_session(SynthesisOptions(instructions="Speak softly."))
    assert torch.equal(session.lm_prompt.text_ids, instruct.lm_prompt.text_ids)
    assert session.lm_prompt.speech_tokens.shape == (1, 0)
    with pytest.raises(ValueError, match="speed"):
        zero_shot.open_session(SynthesisOptions(speed=1.5))


def test_segments(serving_service: Any) -> None:
    """Each segment is one LM run and one token2wav stream; segments_done counts them, empty ones included."""
    voice = serving_service.speakers["cosyvoice2-sft"]
    both = voice.open_session(SynthesisOptions(seed=2))
    chunks, _, tokens = drive(both, ["Hi.", "", "Yes."])
    hi, yes = most_tokens(serving_service, "Hi."), most_tokens(serving_service, "Yes.")
    assert both.segments_done == 3 and [len(t) for t in tokens] == [hi, 0, yes]
    per_token = samples_per_token(serving_service)
    assert sum(len(c) for c in chunks) == (hi + yes) * per_token
    first_alone, _, _ = drive(voice.open_session(SynthesisOptions(seed=2)), ["Hi."])
    assert np.array_equal(np.concatenate(chunks)[: hi * per_token], np.concatenate(first_alone))


def test_interleaved_sessions_match_solo_runs(serving_service: Any, prompt: Any) -> None:
    """Two sessions whose LM steps share calls (and whose chunks interleave) make what each makes alone."""
    service = serving_service
    voices = [service.speakers["cosyvoice2-sft"], service.prompt_voice(prompt, "cross_lingual")]
    solo = [np.concatenate(drive(v.open_session(SynthesisOptions(seed=9)), ["Okay."])[0]) for v in voices]
    sessions = [v.open_session(SynthesisOptions(seed=9)) for v in voices]
    audio: list[list[np.ndarray]] = [[], []]
    for s in sessions:
        s.add_segment("Okay.")
    while True:
        steps = [(i, s.next_step()) for i, s in enumerate(sessions)]
        steps = [(i, step) for i, step in steps if step is not None]
        if not steps:
            break
        lm = [(i, step) for i, step in steps if step.kind == "lm"]
        if len(lm) == 2 and lm[0][1].batch_key == lm[1][1].batch_key:  # one call for both, any speaker
            results = voices[1].run([step.payload for _, step in lm])
            batch = list(zip(lm, results, strict=True))
        else:
            batch = [((i, step), sessions[i].voice.run([step.payload])[0]) for i, step in steps]
        for (i, step), result in batch:
            out = sessions[i].complete(step, result)
            if out is not None:
                audio[i].append(out)
    for got, alone in zip(audio, solo, strict=True):
        assert np.array_equal(np.concatenate(got), alone)


def test_concurrent_streams_through_the_engine(serving_service: Any) -> None:
    """Through the real scheduler (two runner threads calling the shared model at once): two streams at the
    same time equal each stream alone."""
    from rtvoice.engine.engine import Engine
    from rtvoice.engine.settings import EngineSettings
    from rtvoice.engine.voices import VoiceRegistry

    registry = VoiceRegistry(serving_service.voices())
    registry.cosyvoice = serving_service

    async def run() -> tuple[list[np.ndarray], list[np.ndarray], list[Any]]:
        # Admission by measured costs would hold the second stream back on a slow machine: not what is tested here.
        engine = Engine(EngineSettings(warmup=False, runner_threads=2, max_load=1000), voices=registry)
        await engine.start()
        try:

            async def one(seed: int) -> np.ndarray:
                stream = engine.open_stream(
                    SynthesisRequest(text="Hi. Ok.", voice="cosyvoice2-sft", options=SynthesisOptions(seed=seed))
                )
                return np.concatenate([pcm async for pcm in stream.audio()])

            alone = [await one(1), await one(2)]
            engine.scheduler.decisions.clear()
            together = list(await asyncio.gather(one(1), one(2)))
            return alone, together, list(engine.scheduler.decisions)
        finally:
            await engine.stop()

    alone, together, decisions = asyncio.run(run())
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)
    segments = most_tokens(serving_service, "Hi.") + most_tokens(serving_service, "Ok.")
    assert len(alone[0]) == segments * samples_per_token(serving_service)
    assert not np.array_equal(alone[0], alone[1])
    # The streams overlap: the second's first call comes before the first's last (how many calls the first makes
    # before the second is admitted follows the machine's speed, so no count is asserted).
    order = [stream for decision in decisions for stream in decision.stream_ids]
    first, second = order[0], next(stream for stream in order if stream != order[0])
    assert order.index(second) < len(order) - 1 - order[::-1].index(first), f"the second waited: {decisions}"
    assert all(len(d.stream_ids) == 1 for d in decisions if d.kind == "token2wav")


def test_warmup_runs_on_the_fixture(serving_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up runs the LM's steps and token-to-wave chunks once per model, and makes audio; a second warm-up
    runs nothing."""
    runner = serving_service.runner
    calls: dict[str, int] = {"lm": 0, "token2wav": 0}
    chunks: list[Any] = []
    llm, token2wav = runner.model.llm, runner.model.token2wav
    forward_step, step_many = llm.forward_step, token2wav.step_many

    def counted_forward_step(streams: Any) -> Any:
        calls["lm"] += 1
        return forward_step(streams)

    def counted_step_many(streams: Any) -> Any:
        calls["token2wav"] += 1
        made = step_many(streams)
        chunks.extend(made)
        return made

    monkeypatch.setattr(llm, "forward_step", counted_forward_step)
    monkeypatch.setattr(token2wav, "step_many", counted_step_many)
    monkeypatch.setattr(runner, "_warm", False)
    serving_service.warmup()
    assert calls["lm"] >= 1 and calls["token2wav"] >= 2  # a streaming chunk and the final one
    assert sum(chunk.numel() for chunk in chunks) > 0
    before = dict(calls)
    serving_service.warmup()
    assert calls == before


def test_registered_voices_follow_a_shared_directory(serving_service: Any, prompt: Any) -> None:
    """Replicas behind a balancer share the voices directory: a voice another replica saved there is served here the
    first time it is named, listed with the rest, and gone once another replica deletes its file."""
    from rtvoice.engine import cloning
    from rtvoice.engine.models.cosyvoice2.voice_store import SavedVoice
    from rtvoice.engine.voices import VoiceRegistry

    registry = VoiceRegistry(serving_service.voices())
    registry.cosyvoice = serving_service
    store = serving_service.store
    store.save(SavedVoice("elsewhere", "From r2", "en", "", prompt))  # what another replica's registration writes
    assert "elsewhere" not in registry
    cloning.sync_voice(registry, "elsewhere")
    voice = registry.get("elsewhere")
    assert voice is not None and voice.info.source == "registered" and voice.info.name == "From r2"
    store.save(SavedVoice("listed", "Listed", "en", "", prompt))
    cloning.sync_registered(registry)
    assert "listed" in registry.ids()
    store.delete("elsewhere")  # deleted through another replica
    cloning.sync_voice(registry, "elsewhere")
    assert "elsewhere" not in registry
    store.delete("listed")
    cloning.sync_registered(registry)
    assert "listed" not in registry.ids()
