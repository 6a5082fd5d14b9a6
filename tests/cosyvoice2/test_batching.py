"""Batched CosyVoice2 steps equal unbatched ones: LM steps of many streams in one backbone pass (with
streams joining and leaving between steps), and token-to-wave chunks of many streams in one call."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2 import FlowPrompt  # noqa: E402

LOGP_TOL = 1e-4
AUDIO_TOL = 1e-4


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


def _solo(model: Any, stream: Any) -> tuple[list[int], list[Any]]:
    tokens, logps = [], []
    while not stream.finished:
        logp = model.llm.forward_step([stream])[0]
        logps.append(logp)
        if (token := model.llm.choose(stream, logp, greedy=True)) is not None:
            tokens.append(token)
    return tokens, logps


def test_lm_batched_steps_equal_solo_with_joins_and_leaves(model: Any, vectors: dict[str, Any]) -> None:
    """Streams join (their prefill shares a call with others' decode steps, or with other prefills), skip
    steps (as when a token2wav chunk runs instead), and leave when done: tokens identical, log-probs 1e-4."""
    solo = [_solo(model, s) for s in _lm_streams(model, vectors)]
    streams = _lm_streams(model, vectors)
    joins = {0: [0], 3: [1], 6: [2, 3], 7: [4]}  # step -> streams that start then
    live: list[int] = []
    logps: list[list[Any]] = [[] for _ in streams]
    batch_sizes = []
    step = 0
    while step in joins or live or any(not s.finished for s in streams if s.position == 0):
        live += joins.get(step, [])
        # every 5th step stream 0 sits out, every 4th stream 3 does (a token2wav chunk in its place)
        batch = [i for i in live if not ((i == 0 and step % 5 == 4) or (i == 3 and step % 4 == 3))]
        if batch:
            batch_sizes.append(len(batch))
            for i, logp in zip(batch, model.llm.forward_step([streams[i] for i in batch]), strict=True):
                logps[i].append(logp)
                model.llm.choose(streams[i], logp, greedy=True)
        live = [i for i in live if not streams[i].finished]
        step += 1
        if step > 500:
            raise AssertionError("decoding did not end")
    assert max(batch_sizes) >= 4
    for i, (tokens, want_logps) in enumerate(solo):
        assert streams[i].tokens == tokens, f"stream {i}: batched greedy tokens differ"
        assert len(logps[i]) == len(want_logps)
        err = float((torch.stack(logps[i]) - torch.stack(want_logps)).abs().max())
        assert err < LOGP_TOL, f"stream {i}: log-prob error {err}"


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
    stream = lm.start(vectors["llm_text"], vectors["llm_prompt_text"], vectors["prompt_tokens"],
                      min_token_text_ratio=20, max_token_text_ratio=20)
    other = lm.start(vectors["llm_text"][:, :4], vectors["llm_prompt_text"][:, :0], vectors["prompt_tokens"][:, :0],
                     min_token_text_ratio=20, max_token_text_ratio=20)
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


def _t2w_cases(vectors: dict[str, Any]) -> list[tuple[FlowPrompt, list[int]]]:
    """Prompts of different lengths (none, as an SFT speaker) and token sequences of different lengths."""
    tokens = vectors["tokens"][0].tolist()
    full = FlowPrompt(vectors["prompt_tokens"], vectors["prompt_feat"], vectors["embedding"])
    short = FlowPrompt(vectors["prompt_tokens"][:, :6], vectors["prompt_feat"][:, :12], vectors["embedding"] * 0.5)
    none = FlowPrompt(vectors["prompt_tokens"][:, :0], vectors["prompt_feat"][:, :0], -vectors["embedding"])
    return [(full, tokens), (short, tokens[::-1][:70]), (none, tokens[5:]), (full, tokens[:40]), (none, tokens[:31])]


@pytest.mark.parametrize("random_source", [False, True])
def test_token2wav_batched_chunks_equal_solo(model: Any, vectors: dict[str, Any], random_source: bool) -> None:
    """Streams at different points of their hop schedules (first chunk, later chunks, the final flush), with
    different prompts, share calls: each stream's chunks equal its solo run (1e-4), HiFT noise included."""
    cases = _t2w_cases(vectors)
    model.hift.m_source.random_source = random_source
    try:
        solo = []
        for k, (prompt, tokens) in enumerate(cases):
            stream = model.token2wav.stream(prompt, torch.Generator().manual_seed(k))
            solo.append(stream.push(tokens) + stream.finish())
        streams = [model.token2wav.stream(p, torch.Generator().manual_seed(k)) for k, (p, _) in enumerate(cases)]
        got: list[list[Any]] = [[] for _ in cases]
        rates = [7, 30, 11, 40, 3]  # tokens each stream receives per round: their chunks fall due at different times
        sizes = []
        rounds = 0
        while not all(s.done for s in streams):
            rounds += 1
            for s, (_, tokens), rate in zip(streams, cases, rates, strict=True):
                if not s.ended:
                    s.add_tokens(tokens[len(s.tokens) : len(s.tokens) + rate])
                    if len(s.tokens) == len(tokens):
                        s.end()
            ready = [i for i, s in enumerate(streams) if s.ready()]
            if ready and (rounds % 3 == 0 or all(s.ended for s in streams)):  # let chunks fall due together
                sizes.append(len(ready))
                for i, chunk in zip(ready, model.token2wav.step_many([streams[i] for i in ready]), strict=True):
                    got[i].append(chunk)
    finally:
        model.hift.m_source.random_source = False
    assert max(sizes) >= 3
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
        single = [model.flow(i.token, i.prompt_token, i.prompt_feat, i.embedding, i.streaming, i.finalize)
                  for i in items]
        batched = model.flow.forward_batch(items)
    for a, b in zip(single, batched, strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) < AUDIO_TOL


def test_token2wav_same_stream_twice_is_refused(model: Any, vectors: dict[str, Any]) -> None:
    prompt, tokens = _t2w_cases(vectors)[0]
    stream = model.token2wav.stream(prompt)
    stream.add_tokens(tokens)
    with pytest.raises(ValueError, match="twice"):
        model.token2wav.step_many([stream, stream])


def test_voice_batches_token2wav_chunks_through_the_service(serving_service: Any) -> None:
    """The voice hands a batch of token2wav payloads to one batched call: each result equals its solo call;
    the limit is 1 on a CPU unless set."""
    from rtvoice.engine.models.cosyvoice2.voice import Token2WavJob

    voice = serving_service.speakers["cosyvoice2-saved"]
    assert voice.max_batch("token2wav") == (1 if serving_service.device.type == "cpu" else 8)
    assert voice.max_batch("lm") >= 16
    source = serving_service.model.hift.m_source

    def jobs() -> list[Any]:
        out = []
        for k in range(3):
            stream = serving_service.model.token2wav.stream(voice.flow_prompt, torch.Generator().manual_seed(k))
            stream.add_tokens(list(range(100 + 7 * k, 160 + 9 * k)))
            out.append(Token2WavJob(stream))
        return out

    source.random_source = False
    try:
        solo = [voice.run("token2wav", [job])[0] for job in jobs()]
        together = voice.run("token2wav", jobs())
    finally:
        source.random_source = True
    for a, b in zip(solo, together, strict=True):
        assert a.shape == b.shape and float(abs(a - b).max()) < AUDIO_TOL
