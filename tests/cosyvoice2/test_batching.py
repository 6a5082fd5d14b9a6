"""Batched CosyVoice2 steps equal unbatched ones: LM steps of many streams in one backbone pass (with
streams joining and leaving between steps), and token-to-wave chunks of many streams in one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2 import FlowPrompt  # noqa: E402

LOGP_TOL = 1e-5
AUDIO_TOL = 1e-4
# Bounded example counts and no deadline: each example decodes or vocodes several streams twice (alone and
# batched), and the machine is shared. Derandomized and without a database, so every run (and CI) tries the same
# schedules and nothing is written to the repository. No shrinking: a failure reports the schedule it drew, and
# shrinking one (minutes of model calls) would outlast the test timeout.
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
LM_SETTINGS = settings(
    max_examples=24,
    deadline=None,
    derandomize=True,
    database=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
T2W_SETTINGS = settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class LMSpec:
    """One stream's inputs, drawn from the checkpoint's vocabularies; lengths chosen so that some streams start past
    a KV block (a long voice prompt) and others never reach one."""

    text: list[int]
    prompt_text: list[int]
    prompt_speech: list[int]
    min_len: int
    max_len: int

    def start(self, lm: Any) -> Any:
        ids = lambda values: torch.tensor([values], dtype=torch.int32)  # noqa: E731
        stream = lm.start(ids(self.text), ids(self.prompt_text), ids(self.prompt_speech))
        stream.max_len, stream.min_len = self.max_len, self.min_len
        return stream


@st.composite
def lm_specs(draw: Any, text_vocab: int, speech_vocab: int) -> LMSpec:
    from rtvoice.engine.models.cosyvoice2.llm import KV_BLOCK

    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    n_text = draw(st.integers(1, 12))
    n_prompt_text = draw(st.integers(0, 8))
    n_prompt_speech = draw(st.one_of(st.integers(0, 24), st.integers(KV_BLOCK - 30, KV_BLOCK + 30)))
    max_len = draw(st.integers(1, 40))
    return LMSpec(
        text=torch.randint(0, text_vocab, (n_text,), generator=g).tolist(),
        prompt_text=torch.randint(0, text_vocab, (n_prompt_text,), generator=g).tolist(),
        prompt_speech=torch.randint(0, speech_vocab, (n_prompt_speech,), generator=g).tolist(),
        min_len=draw(st.integers(0, max_len)),
        max_len=max_len,
    )


def _decode_alone(lm: Any, spec: LMSpec) -> list[tuple[Any, int | None]]:
    """(log-probs, greedy token or None at the stop) of each step of the stream decoded on its own."""
    stream, steps = spec.start(lm), []
    while not stream.finished:
        logp = lm.forward_step([stream])[0]
        steps.append((logp, lm.choose(stream, logp, greedy=True)))
    return steps


@LM_SETTINGS
@given(data=st.data(), n_streams=st.integers(4, 6))
def test_lm_batched_steps_equal_solo_for_any_schedule(model: Any, data: Any, n_streams: int) -> None:
    """Random schedules: streams of any age, prompt and cache capacity join (their prefill shares a call with others'
    decode steps), sit out steps (a token-to-wave chunk in their place), finish, or are cancelled, between calls.
    Every batched step equals the same stream run alone: greedy tokens identical, log-probs within 1e-5."""
    lm = model.llm
    specs = [
        data.draw(lm_specs(lm.backbone.config.vocab_size, lm.cfg.speech_token_size), label=f"stream {i}")
        for i in range(n_streams)
    ]
    alone = [_decode_alone(lm, spec) for spec in specs]
    joins = [data.draw(st.integers(0, 5), label=f"stream {i} joins at step") for i in range(n_streams)]
    streams: list[Any] = [None] * n_streams
    done = [False] * n_streams  # finished or cancelled
    steps_taken = [0] * n_streams
    step = 0
    while not all(done):
        for i in range(n_streams):
            if streams[i] is None and joins[i] <= step:
                streams[i] = specs[i].start(lm)
        live = [i for i in range(n_streams) if streams[i] is not None and not done[i]]
        for i in live:
            if data.draw(st.integers(0, 19), label=f"cancel stream {i}?") == 0:
                done[i] = True  # cancelled: dropped between calls, nothing to free
        live = [i for i in live if not done[i]]
        # most streams run at most steps; the others sit this one out (as for a token-to-wave chunk)
        batch = [i for i in live if data.draw(st.integers(0, 4), label=f"stream {i} sits out step {step}?") > 0]
        if batch:
            capacities = {streams[i].kv.shape[3] for i in batch if streams[i].kv is not None}
            event(f"a call of {len(batch)}" + (" mixing KV capacities" if len(capacities) > 1 else ""))
            for i, logp in zip(batch, lm.forward_step([streams[i] for i in batch]), strict=True):
                want_logp, want_token = alone[i][steps_taken[i]]
                err = float((logp - want_logp).abs().max())
                assert err < LOGP_TOL, f"stream {i} step {steps_taken[i]} in a batch of {len(batch)}: error {err}"
                assert lm.choose(streams[i], logp, greedy=True) == want_token
                steps_taken[i] += 1
                done[i] = streams[i].finished
        step += 1
    for i, stream in enumerate(streams):
        if stream.finished:
            assert steps_taken[i] == len(alone[i])


def test_lm_streams_with_different_kv_capacities_share_a_step(model: Any, vectors: dict[str, Any]) -> None:
    """The issue's case: a stream steps alone until its cache outgrows a KV block, then a new stream (one block)
    joins it; they decode together to the end, each step equal to the stream run alone."""
    from rtvoice.engine.models.cosyvoice2.llm import KV_BLOCK

    lm = model.llm
    keys = ("llm_text", "llm_prompt_text", "prompt_tokens")
    text, prompt_text, prompt_speech = (vectors[k][0].tolist() for k in keys)
    old_spec = LMSpec(text, prompt_text, prompt_speech, min_len=KV_BLOCK + 20, max_len=KV_BLOCK + 20)
    new_spec = LMSpec(text, prompt_text, [], min_len=10, max_len=30)
    alone = {"old": _decode_alone(lm, old_spec), "new": _decode_alone(lm, new_spec)}
    streams = {"old": old_spec.start(lm)}
    taken = {"old": 0, "new": 0}

    def run(names: list[str]) -> None:
        for name, logp in zip(names, lm.forward_step([streams[n] for n in names]), strict=True):
            want_logp, want_token = alone[name][taken[name]]
            assert float((logp - want_logp).abs().max()) < LOGP_TOL
            assert lm.choose(streams[name], logp, greedy=True) == want_token
            taken[name] += 1

    while streams["old"].position <= KV_BLOCK:
        run(["old"])
    streams["new"] = new_spec.start(lm)
    assert streams["old"].kv.shape[3] > KV_BLOCK >= streams["new"].pending.shape[1]
    while live := [n for n, stream in streams.items() if not stream.finished]:
        run(live)
    assert taken == {name: len(steps) for name, steps in alone.items()}


def _lm_streams(model: Any, vectors: dict[str, Any]) -> list[Any]:
    """Five streams with different prompt and text lengths (so different cache lengths at every step)."""
    text, prompt_text, prompt_tokens = vectors["llm_text"], vectors["llm_prompt_text"], vectors["prompt_tokens"]
    specs = [
        (text, prompt_text, prompt_tokens),
        (text[:, :5], prompt_text[:, :3], prompt_tokens[:, :9]),
        (text[:, 2:], prompt_text[:, :0], prompt_tokens[:, :0]),  # sft-like: no prompt
        (text[:, :8], prompt_text, prompt_tokens[:, :0]),  # instruct-like: prompt text only
        (text[:, 3:9], prompt_text[:, 2:], prompt_tokens[:, 4:]),
    ]
    return [model.llm.start(t, pt, ps, min_token_text_ratio=2, max_token_text_ratio=3) for t, pt, ps in specs]


def test_lm_batched_prefill_equals_single(model: Any, vectors: dict[str, Any]) -> None:
    single = [model.llm.forward_step([s])[0] for s in _lm_streams(model, vectors)]
    streams = _lm_streams(model, vectors)
    batched = model.llm.forward_step(streams)
    for a, b in zip(single, batched, strict=True):
        assert float((a - b).abs().max()) < LOGP_TOL
    assert [s.position for s in streams] == [s.pending.shape[1] + 0 for s in _lm_streams(model, vectors)]


def test_lm_kv_buffer_grows_across_blocks(model: Any, vectors: dict[str, Any]) -> None:
    """A stream whose cache outgrows its first KV block keeps matching an uncached forward pass."""
    from rtvoice.engine.models.cosyvoice2.llm import KV_BLOCK

    lm = model.llm
    stream = lm.start(
        vectors["llm_text"],
        vectors["llm_prompt_text"],
        vectors["prompt_tokens"],
        min_token_text_ratio=20,
        max_token_text_ratio=20,
    )
    other = lm.start(
        vectors["llm_text"][:, :4],
        vectors["llm_prompt_text"][:, :0],
        vectors["prompt_tokens"][:, :0],
        min_token_text_ratio=20,
        max_token_text_ratio=20,
    )
    logps = []
    while stream.position < KV_BLOCK + 20 and not stream.finished:
        pair = [stream, other] if not other.finished else [stream]
        results = lm.forward_step(pair)
        logps.append(results[0])
        lm.choose(stream, results[0], greedy=True)
        if len(pair) == 2:
            lm.choose(other, results[1], greedy=True)
    assert stream.kv is not None and stream.kv.shape[3] > KV_BLOCK
    with torch.inference_mode():
        prefix = lm.prompt_embeddings(vectors["llm_text"], vectors["llm_prompt_text"], vectors["prompt_tokens"])
        seq = torch.cat([prefix, lm.speech_embedding(torch.tensor([stream.tokens]))], dim=1)
        hidden = lm.backbone(inputs_embeds=seq, use_cache=False).last_hidden_state[0]
        full = torch.log_softmax(lm.llm_decoder(hidden[prefix.shape[1] - 1 :]), dim=-1)
    assert float((full[: len(logps)] - torch.stack(logps)).abs().max()) < LOGP_TOL


def test_lm_same_stream_twice_in_a_step_is_refused(model: Any, vectors: dict[str, Any]) -> None:
    (stream,) = _lm_streams(model, vectors)[:1]
    with pytest.raises(ValueError, match="twice"):
        model.llm.forward_step([stream, stream])


@dataclass(frozen=True)
class T2WSpec:
    """One token-to-wave stream: a voice prompt of ``n_prompt`` tokens (0: an SFT speaker) and ``n_tokens`` speech
    tokens, drawn from ``seed`` in the checkpoint's vocabulary and feature sizes."""

    seed: int
    n_prompt: int
    n_tokens: int

    def build(self, model: Any) -> tuple[FlowPrompt, list[int]]:
        flow = model.config.flow
        g = torch.Generator().manual_seed(self.seed)
        prompt = FlowPrompt(
            torch.randint(0, flow.vocab_size, (1, self.n_prompt), generator=g, dtype=torch.int32),
            torch.randn(1, self.n_prompt * flow.token_mel_ratio, flow.output_size, generator=g) * 2 - 6,
            torch.randn(1, flow.spk_embed_dim, generator=g),
        )
        return prompt, torch.randint(0, flow.vocab_size, (self.n_tokens,), generator=g).tolist()


@st.composite
def t2w_specs(draw: Any, chunk_size: int) -> T2WSpec:
    return T2WSpec(
        seed=draw(st.integers(0, 2**31 - 1)),
        n_prompt=draw(st.one_of(st.just(0), st.integers(1, 2 * chunk_size))),
        # from a lone final chunk to a first hop, a second one and the flush
        n_tokens=draw(st.integers(1, 3 * chunk_size)),
    )


@T2W_SETTINGS
@given(data=st.data(), n_streams=st.integers(3, 4), random_source=st.booleans())
def test_token2wav_batched_chunks_equal_solo_for_any_mix(
    model: Any, data: Any, n_streams: int, random_source: bool
) -> None:
    """Random mixes: streams with different prompts receive tokens at random rates, so their chunks fall due at
    different points of their hop schedules (first hop with its prompt pad, later hops, the final flush), and random
    subsets of the due ones share a call. Each stream's chunks equal its solo run within 1e-4, HiFT noise included."""
    t2w = model.token2wav
    specs = [data.draw(t2w_specs(t2w.chunk_size), label=f"stream {i}") for i in range(n_streams)]
    cases = [spec.build(model) for spec in specs]
    model.hift.m_source.random_source = random_source
    try:
        solo = []
        for k, (prompt, tokens) in enumerate(cases):
            stream = t2w.stream(prompt, torch.Generator().manual_seed(k))
            solo.append(stream.push(tokens) + stream.finish())
        streams = [t2w.stream(prompt, torch.Generator().manual_seed(k)) for k, (prompt, _) in enumerate(cases)]
        got: list[list[Any]] = [[] for _ in cases]
        while not all(s.done for s in streams):
            for i, (s, (_, tokens)) in enumerate(zip(streams, cases, strict=True)):
                if not s.ended:
                    n = data.draw(st.integers(1, 2 * t2w.chunk_size), label=f"tokens for stream {i}")
                    s.add_tokens(tokens[len(s.tokens) : len(s.tokens) + n])
                    if len(s.tokens) == len(tokens):
                        s.end()
            ready = [i for i, s in enumerate(streams) if s.ready()]
            if all(s.ended for s in streams):
                batch = ready  # nothing more will arrive: flush
            else:
                batch = [i for i in ready if data.draw(st.integers(0, 3), label=f"stream {i} waits?") > 0]
            if batch:
                for i, chunk in zip(batch, t2w.step_many([streams[i] for i in batch]), strict=True):
                    got[i].append(chunk)
                finals = sum(streams[i].done for i in batch)
                mixed = 0 < finals < len(batch)
                event(f"a call of {len(batch)}" + (" mixing final and streaming chunks" if mixed else ""))
    finally:
        model.hift.m_source.random_source = False
    for k, (want, have) in enumerate(zip(solo, got, strict=True)):
        assert [c.shape for c in have] == [c.shape for c in want], f"stream {k}: chunk sizes differ"
        err = max(float((a - b).abs().max()) for a, b in zip(have, want, strict=True))
        assert err < AUDIO_TOL, f"stream {k}: batched chunks differ by {err}"


def test_flow_batch_equals_single_calls(model: Any, vectors: dict[str, Any]) -> None:
    """The padded flow batch: streaming and final calls, with and without prompts, in one call."""
    from rtvoice.engine.models.cosyvoice2.flow import FlowItem

    tokens = vectors["tokens"]
    p_tok, p_feat, emb = vectors["prompt_tokens"], vectors["prompt_feat"], vectors["embedding"]
    items = [
        FlowItem(tokens[:, :36], p_tok, p_feat, emb, streaming=True, finalize=False),
        FlowItem(tokens[:, :53], p_tok[:, :0], p_feat[:, :0], emb, streaming=True, finalize=False),
        FlowItem(tokens[:, :90], p_tok, p_feat, emb, streaming=False, finalize=True),
        FlowItem(tokens[:, 10:40], p_tok[:, :5], p_feat[:, :10], -emb, streaming=False, finalize=True),
    ]
    with torch.inference_mode():
        single = [
            model.flow(i.token, i.prompt_token, i.prompt_feat, i.embedding, i.streaming, i.finalize) for i in items
        ]
        batched = model.flow.forward_batch(items)
    for a, b in zip(single, batched, strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) < AUDIO_TOL


def test_token2wav_same_stream_twice_is_refused(model: Any) -> None:
    prompt, tokens = T2WSpec(seed=0, n_prompt=5, n_tokens=40).build(model)
    stream = model.token2wav.stream(prompt)
    stream.add_tokens(tokens)
    with pytest.raises(ValueError, match="twice"):
        model.token2wav.step_many([stream, stream])


def test_voice_batches_token2wav_chunks_through_the_service(serving_service: Any) -> None:
    """The voice hands a batch of token2wav payloads to one batched call: each result equals its solo call;
    the limit is 1 on a CPU unless set."""
    from rtvoice.engine.models.cosyvoice2.steps import Token2WavJob

    voice = serving_service.speakers["cosyvoice2-saved"]
    assert voice.max_batch("token2wav") == (1 if serving_service.device.type == "cpu" else 8)
    assert voice.max_batch("lm") >= 16
    source = serving_service.model.hift.m_source

    def jobs() -> list[Any]:
        out = []
        for k in range(3):
            stream = serving_service.model.token2wav.stream(voice.flow_prompt, torch.Generator().manual_seed(k))
            stream.add_tokens(list(range(100 + 7 * k, 160 + 9 * k)))
            out.append(Token2WavJob(stream, stream.plan()))
        return out

    source.random_source = False
    try:
        solo = [voice.run([job])[0] for job in jobs()]
        together = voice.run(jobs())
    finally:
        source.random_source = True
    for a, b in zip(solo, together, strict=True):
        assert a.shape == b.shape and float(abs(a - b).max()) < AUDIO_TOL
