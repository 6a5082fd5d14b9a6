"""The LM's KV slot pool, its device-side decode step (bucketed and padded as the CUDA graphs run it, here eagerly)
and the batched sampler, on the tiny fixture: the same log-probabilities and greedy tokens as the reference, batched
steps equal to solo ones, padding rows that change nothing, slots reused, and the batched sampler against the
per-stream one."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2.config import SamplingConfig  # noqa: E402
from rtvoice.engine.models.cosyvoice2.cuda_graphs import (  # noqa: E402
    BATCH_BUCKETS,
    batch_bucket,
    length_bucket,
)
from rtvoice.engine.models.cosyvoice2.kv_pool import SCRATCH  # noqa: E402
from rtvoice.engine.models.cosyvoice2.llm import KV_BLOCK, llm_dtype  # noqa: E402
from rtvoice.engine.models.cosyvoice2.sampling import (  # noqa: E402
    draws_per_step,
    nucleus_sample,
    ras_sample,
    sample_batch,
)

TOL = 1e-4
BATCH_TOL = 1e-5


@contextmanager
def bucketed(lm: Any) -> Iterator[Any]:
    """Decode calls at the CUDA graphs' bucketed, padded shapes, run eagerly."""
    before = lm.decode_graphs
    graphs = lm.use_decode_graphs(capture=False)
    try:
        yield graphs
    finally:
        lm.decode_graphs = before


def _start(lm: Any, vectors: dict[str, Any], variant: int = 0, seed: int | None = None, **ratios: float) -> Any:
    """A stream on the fixture's inputs; ``variant`` cuts them differently (other prompt and text lengths)."""
    text, prompt_text, prompt_tokens = vectors["llm_text"], vectors["llm_prompt_text"], vectors["prompt_tokens"]
    cuts = [
        (text, prompt_text, prompt_tokens),
        (text[:, :5], prompt_text[:, :3], prompt_tokens[:, :9]),
        (text[:, 2:], prompt_text[:, :0], prompt_tokens[:, :0]),
        (text[:, :8], prompt_text, prompt_tokens[:, :0]),
        (text[:, 3:9], prompt_text[:, 2:], prompt_tokens[:, 4:]),
    ]
    t, pt, ps = cuts[variant % len(cuts)]
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return lm.start(
        t,
        pt,
        ps,
        generator=generator,
        min_token_text_ratio=ratios.get("min_ratio", 2),
        max_token_text_ratio=ratios.get("max_ratio", 4),
    )


def _pool_state(pool: Any) -> dict[str, Any]:
    return {name: getattr(pool, name).clone() for name in ("kv", "lengths", "last_token", "n_tokens", "window")}


def _restore(pool: Any, state: dict[str, Any]) -> None:
    with torch.inference_mode():
        for name, value in state.items():
            getattr(pool, name).copy_(value)


# -- the slot cache against the reference -------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", ["exact", "bucketed"])
def test_step_makes_the_reference_greedy_tokens(model: Any, vectors: dict[str, Any], shapes: str) -> None:
    """``step`` (the device path: decode from the slots, batched sampler) reproduces the reference's greedy decode."""
    lm = model.llm
    stream = _start(lm, vectors)
    if shapes == "bucketed":
        with bucketed(lm):
            tokens = list(lm.generate(stream, greedy=True))
    else:
        tokens = list(lm.generate(stream, greedy=True))
    assert tokens == vectors["llm_greedy_tokens"].tolist()
    assert stream.finished and stream.slot is None


def test_bucketed_decode_logp_equals_the_reference(model: Any, vectors: dict[str, Any], record_error: Any) -> None:
    """Each decode step at a padded batch bucket and a length bucket gives the reference's log-probabilities."""
    lm = model.llm
    stream = _start(lm, vectors)
    logps = [lm.forward_step([stream])[0]]  # the prefill
    lm.choose(stream, logps[0], greedy=True)
    with torch.inference_mode():
        while not stream.finished:
            slot = stream.slot
            padded = torch.tensor([slot, SCRATCH, SCRATCH, SCRATCH])
            length = length_bucket(stream.position + 1, KV_BLOCK)
            logits = lm._decode_logits(lm.pool.current, padded, length, None)
            stream.position += 1
            logp = torch.log_softmax(logits, dim=-1)[0]
            logps.append(logp)
            stream.awaiting_token = True
            lm.choose(stream, logp, greedy=True)
    want = vectors["llm_step_logp"]
    assert record_error("llm_step_logp (bucketed)", want, torch.stack(logps)) < TOL
    assert stream.tokens == vectors["llm_greedy_tokens"].tolist()


# -- batches, padding and buckets -----------------------------------------------------------------------------------


def _prefill_and_decode(lm: Any, streams: list[Any], steps: int) -> None:
    lm.step(streams, greedy=True)
    for _ in range(steps):
        lm.step([s for s in streams if not s.finished], greedy=True)


def test_padding_rows_change_nothing(model: Any, vectors: dict[str, Any]) -> None:
    """A decode call of three streams padded to the bucket of four, over a longer length bucket: the same
    log-probabilities and cache writes as the exact call; streams outside the call and the scratch slot's length
    untouched."""
    lm = model.llm
    streams = [_start(lm, vectors, variant=v, max_ratio=8) for v in range(4)]
    _prefill_and_decode(lm, streams, 3)
    calling, outside = streams[:3], streams[3]
    pool = lm.pool
    before = _pool_state(pool)
    slots = [s.slot for s in calling]
    longest = max(s.position for s in calling) + 1
    with torch.inference_mode():
        exact = lm._decode_logits(pool.current, torch.tensor(slots), longest, None)
        exact_state = _pool_state(pool)
        _restore(pool, before)
        padded_slots = torch.tensor(slots + [SCRATCH])
        bucket = length_bucket(longest, KV_BLOCK)
        padded = lm._decode_logits(pool.current, padded_slots, bucket, None)
    assert padded.shape[0] == batch_bucket(3) == 4 and bucket > longest
    assert float((padded[:3] - exact).abs().max()) < BATCH_TOL
    for slot in slots:
        assert float((pool.kv[:, :, slot] - exact_state["kv"][:, :, slot]).abs().max()) < BATCH_TOL
        assert int(pool.lengths[slot]) == int(exact_state["lengths"][slot])
    assert torch.equal(pool.kv[:, :, outside.slot], before["kv"][:, :, outside.slot])
    assert int(pool.lengths[outside.slot]) == outside.position
    assert int(pool.lengths[SCRATCH]) == 0
    _restore(pool, exact_state)


def test_bucket_selection() -> None:
    assert BATCH_BUCKETS == (1, 2, 4, 8, 16, 32)
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 32)] == [1, 2, 4, 4, 8, 8, 16, 32, 32]
    assert batch_bucket(33) is None
    assert [length_bucket(n, KV_BLOCK) for n in (1, KV_BLOCK, KV_BLOCK + 1, 3 * KV_BLOCK)] == [
        KV_BLOCK,
        KV_BLOCK,
        2 * KV_BLOCK,
        4 * KV_BLOCK,
    ]


def test_decode_graphs_pick_buckets_within_the_pool(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    with bucketed(lm) as graphs:
        streams = [_start(lm, vectors, variant=v) for v in range(3)]
        lm.step(streams, greedy=True)
        tensors = lm.pool.current
        assert graphs.shapes(3, KV_BLOCK // 2, tensors) == (4, KV_BLOCK)
        assert graphs.shapes(1, 1, tensors) == (1, KV_BLOCK)
        assert graphs.shapes(33, 1, tensors) is None
        batch, length = graphs.shapes(5, lm.pool.length, tensors)  # never past the slots' length
        assert batch == 8 and length == lm.pool.length


@pytest.mark.parametrize("shapes", ["exact", "bucketed"])
def test_batched_sampling_steps_equal_solo_runs(model: Any, vectors: dict[str, Any], shapes: str) -> None:
    """Seeded streams decoded together (streams joining late, of different prompt lengths) make the tokens each
    makes alone: its generator is its own, and its row of the batch equals its solo step."""
    lm = model.llm
    seeds = [11, 12, 13, 14, 15]
    solo = [list(lm.generate(_start(lm, vectors, variant=i, seed=s))) for i, s in enumerate(seeds)]
    streams: list[Any] = []
    step = 0
    with bucketed(lm) if shapes == "bucketed" else _no_change():
        while len(streams) < len(seeds) or any(not s.finished for s in streams):
            if len(streams) < len(seeds) and step % 3 == 0:  # one joins every third step
                streams.append(_start(lm, vectors, variant=len(streams), seed=seeds[len(streams)]))
            live = [s for s in streams if not s.finished]
            if live:
                lm.step(live)
            step += 1
    assert [s.tokens for s in streams] == solo


@contextmanager
def _no_change() -> Iterator[None]:
    yield


def test_wider_than_the_last_bucket_runs_eagerly(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    n = BATCH_BUCKETS[-1] + 1
    with bucketed(lm):
        streams = [_start(lm, vectors, variant=i, max_ratio=1) for i in range(n)]
        _prefill_and_decode(lm, streams, 2)
        want = [list(lm.generate(_start(lm, vectors, variant=i, max_ratio=1), greedy=True))[:3] for i in range(n)]
    assert [s.tokens[:3] for s in streams] == want


def test_steady_decode_builds_no_tensor_from_host_lists(
    model: Any, vectors: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a set of streams has decoded together, their next steps make no tensor from Python values."""
    lm = model.llm
    streams = [_start(lm, vectors, variant=v, seed=v, max_ratio=8) for v in range(3)]
    _prefill_and_decode(lm, streams, 1)
    made: list[Any] = []
    tensor = torch.tensor

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counted)
    for _ in range(3):
        lm.step(streams)
    assert made == []


# -- slots ----------------------------------------------------------------------------------------------------------


def test_slots_are_reused_after_finish_cancel_and_release(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    pool = lm.pool
    gc.collect()
    lm.step([_start(lm, vectors)], greedy=True)  # whatever earlier tests left is taken back
    base = pool.in_use
    slots_before = pool.slots

    done = _start(lm, vectors, max_ratio=1)
    list(lm.generate(done, greedy=True))
    assert done.finished and done.slot is None and done.kv is None
    assert pool.in_use == base

    cancelled = _start(lm, vectors)
    lm.step([cancelled], greedy=True)
    slot = cancelled.slot
    assert slot is not None and slot != SCRATCH and pool.in_use == base + 1
    del cancelled  # a cancelled request's stream is dropped: its finaliser gives the slot back
    assert pool.in_use == base

    again = _start(lm, vectors)
    lm.step([again], greedy=True)
    assert again.slot == slot, "the freed slot is taken again"
    assert int(pool.lengths[slot]) == again.position  # from position 0, not the old stream's length
    lm.release(again)
    lm.release(again)  # twice is harmless
    assert again.slot is None and pool.in_use == base
    assert pool.slots == slots_before, "reuse, not growth"


def test_pool_grows_in_powers_of_two_and_keeps_slots(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    pool = lm.pool
    streams = [_start(lm, vectors, variant=v, max_ratio=8) for v in range(3)]
    _prefill_and_decode(lm, streams, 2)
    kept = {s.slot: s.kv.clone() for s in streams}
    more = [_start(lm, vectors, variant=v, max_ratio=8) for v in range(pool.slots)]  # more than are free
    lm.step(more, greedy=True)
    assert pool.slots & (pool.slots - 1) == 0 and pool.length & (pool.length - 1) == 0
    for s in streams:
        assert torch.equal(s.kv[..., : kept[s.slot].shape[-2], :], kept[s.slot])
    made = [len(s.tokens) for s in streams]
    lm.step(streams, greedy=True)  # they go on where they were: as the same streams alone
    alone = [_start(lm, vectors, variant=v, max_ratio=8) for v in range(3)]
    for s in alone:
        for _ in range(made[0] + 1):
            lm.step([s], greedy=True)
    assert [s.tokens for s in streams] == [s.tokens for s in alone]


def test_growing_does_not_wait_for_a_step_in_flight(model: Any, vectors: dict[str, Any]) -> None:
    """A step in flight keeps its tensors while another call makes the pool grow (no wait: runner threads); as it
    leaves, its slots are carried into the grown tensors."""
    lm = model.llm
    pool = lm.pool
    stream = _start(lm, vectors, max_ratio=8)
    _prefill_and_decode(lm, [stream], 2)
    with torch.inference_mode(), pool.session(lm.device, lm.dtype, held=[stream.slot]) as (_, before):
        others = [_start(lm, vectors, variant=v) for v in range(pool.slots)]
        lm.step(others, greedy=True)  # needs more slots than are free: grows now
        assert pool.current is not before and pool.slots > before.slots
        before.kv[:, :, stream.slot, :, stream.position] = 7.0  # as the step in flight writes its slot
        before.lengths[stream.slot] = stream.position + 1
    after = pool.current
    assert bool((after.kv[:, :, stream.slot, :, stream.position] == 7.0).all())
    assert int(after.lengths[stream.slot]) == stream.position + 1
    lm.release(stream)  # its slot starts afresh for the next stream


def test_a_stream_past_the_models_positions_is_refused(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    stream = _start(lm, vectors)
    stream.position = lm.backbone.config.max_position_embeddings  # as if it had run that far
    with pytest.raises(ValueError, match="positions"):
        lm.forward_step([stream])


def test_step_checks_its_streams(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    stream = _start(lm, vectors)
    with pytest.raises(ValueError, match="twice"):
        lm.step([stream, stream])
    lm.forward_step([stream])
    with pytest.raises(RuntimeError, match="chosen"):
        lm.step([stream])
    lm.release(stream)


def test_runner_threads_step_different_streams_while_the_pool_grows(model: Any, vectors: dict[str, Any]) -> None:
    """Two threads decode their own streams at once (runner threads run LM calls side by side) while new streams
    make the pool grow: each stream's tokens equal its solo run."""
    lm = model.llm
    seeds = list(range(40, 48))
    solo = {s: list(lm.generate(_start(lm, vectors, variant=s, seed=s, max_ratio=6))) for s in seeds}
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(mine: list[int]) -> None:
        try:
            streams = {}
            for seed in mine:
                streams[seed] = _start(lm, vectors, variant=seed, seed=seed, max_ratio=6)
                lm.step([streams[seed]])
                time.sleep(0.001)
            while live := [s for s in streams.values() if not s.finished]:
                lm.step(live)
            got.update({seed: s.tokens for seed, s in streams.items()})
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seeds[i::2],)) for i in range(2)]
    before = torch.get_num_threads()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.set_num_threads(before)
    assert not errors, errors
    assert got == solo


# -- the batched sampler against the per-stream one -----------------------------------------------------------------


def _nucleus(logp: Any, top_p: float, top_k: int) -> set[int]:
    """The reference's candidate set (nucleus_sample's ``keep`` most likely, in its order)."""
    probs, order = logp.softmax(dim=0).sort(descending=True, stable=True)
    keep = int(((torch.cumsum(probs, dim=0) - probs) < top_p).sum().clamp(min=1, max=top_k))
    return set(order[:keep].tolist())


def _uniforms(n: int, seed: int, vocab: int) -> Any:
    return torch.rand(n, draws_per_step(vocab), generator=torch.Generator().manual_seed(seed))


NO_WINDOW = SamplingConfig(top_p=0.8, top_k=25, win_size=10, tau_r=0.1)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.8, 25), (0.5, 3), (0.99, 1000), (0.3, 1), (1.0, 7)])
def test_batched_sampler_stays_in_the_nucleus(top_p: float, top_k: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 300, generator=g) * 3
    logits[::4, :50] = 0.0  # ties, as a flat distribution has
    logp = logits.log_softmax(dim=-1)
    cfg = SamplingConfig(top_p=top_p, top_k=top_k, win_size=10, tau_r=0.1)
    empty = torch.full((64, 10), -1)
    for draw in range(20):
        tokens = sample_batch(logp, _uniforms(64, draw, 300), empty, cfg)
        for row, token in enumerate(tokens.tolist()):
            assert token in _nucleus(logp[row], top_p, top_k)


def test_batched_sampler_breaks_ties_as_the_stable_sort_does() -> None:
    """Tied at the nucleus' edge, the lower ids are the candidates (nucleus_sample's stable sort), never the others."""
    logp = torch.log(torch.tensor([0.1, 0.2, 0.2, 0.2, 0.2, 0.1]))
    cfg = SamplingConfig(top_p=0.9, top_k=2, win_size=10, tau_r=0.1)
    tokens = sample_batch(logp.expand(2000, -1), _uniforms(2000, 4, 6), torch.full((2000, 10), -1), cfg)
    assert set(tokens.tolist()) == {1, 2} == _nucleus(logp, cfg.top_p, cfg.top_k)


def _chi_square(counts: Counter[int], probs: dict[int, float], n: int) -> float:
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in probs.items())


def _nucleus_probs(logp: Any, top_p: float, top_k: int) -> dict[int, float]:
    kept = _nucleus(logp, top_p, top_k)
    probs = logp.softmax(dim=0)
    total = float(sum(probs[t] for t in kept))
    return {t: float(probs[t]) / total for t in kept}


def test_batched_sampler_matches_the_per_stream_distribution() -> None:
    """Many seeded draws of one distribution: the batched sampler's and the reference's frequencies both fit the
    nucleus distribution (chi-square below its 0.1% critical value) and never leave it."""
    logp = (torch.randn(200, generator=torch.Generator().manual_seed(3)) * 1.5).log_softmax(dim=0)
    cfg = NO_WINDOW
    expected = _nucleus_probs(logp, cfg.top_p, cfg.top_k)
    n = 20000
    batched = Counter(sample_batch(logp.expand(n, -1), _uniforms(n, 1, 200), torch.full((n, 10), -1), cfg).tolist())
    g = torch.Generator().manual_seed(2)
    reference = Counter(nucleus_sample(logp, cfg.top_p, cfg.top_k, g) for _ in range(n))
    assert set(batched) <= set(expected) and set(reference) <= set(expected)
    df = len(expected) - 1
    critical = df + 3.3 * (2 * df) ** 0.5 + 10  # above the 0.1% point of chi-square(df) for these df
    assert _chi_square(batched, expected, n) < critical
    assert _chi_square(reference, expected, n) < critical


def test_batched_sampler_redraws_a_repeated_token_as_ras_does() -> None:
    """top_k 1: the nucleus draw is always the top token; once it fills tau_r of the window, the redraw comes from
    the rest of the distribution (never the top token, in its proportions), as ras_sample's."""
    cfg = SamplingConfig(top_p=0.8, top_k=1, win_size=10, tau_r=0.2)
    logp = torch.log(torch.tensor([0.6, 0.25, 0.1, 0.05]))
    n = 8000
    once = torch.tensor([[0, 3, -1, -1, -1, -1, -1, -1, -1, -1]])  # 1 of 10 < 0.2 x 10: kept
    twice = torch.tensor([[0, 0, 3, 1, -1, -1, -1, -1, -1, -1]])  # 2 of 10: drawn again
    assert set(sample_batch(logp.expand(n, -1), _uniforms(n, 5, 4), once.expand(n, -1), cfg).tolist()) == {0}
    redrawn = Counter(sample_batch(logp.expand(n, -1), _uniforms(n, 6, 4), twice.expand(n, -1), cfg).tolist())
    g = torch.Generator().manual_seed(7)
    reference = Counter(ras_sample(logp, [0, 0, 3, 1], cfg, g) for _ in range(n))
    rest = {1: 0.25 / 0.4, 2: 0.1 / 0.4, 3: 0.05 / 0.4}
    for counts in (redrawn, reference):
        assert 0 not in counts
        assert _chi_square(counts, rest, n) < 2 + 3.3 * 2 + 10


def test_greedy_choice_equals_the_reference_argmax(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    stream = _start(lm, vectors, max_ratio=8)
    g = torch.Generator().manual_seed(1)
    while not stream.finished:
        logp = lm.forward_step([stream])[0]
        noisy = (logp + torch.randn(logp.shape, generator=g)).log_softmax(dim=0)
        want = noisy.clone()
        if len(stream.tokens) < stream.min_len:
            want[lm.eos] = float("-inf")
        expected = int(want.argmax())
        token = lm.choose(stream, noisy, greedy=True)
        assert token == (None if expected in lm.stop_tokens else expected)


def test_eos_is_masked_until_min_len_on_the_device(model: Any, vectors: dict[str, Any]) -> None:
    """With eos all but certain, the batched sampler makes other tokens until the stream has min_len of them (the
    count kept on the device), then stops; a min_len raised after the prefill is honoured."""
    lm = model.llm

    def favour_eos(logp: Any) -> Any:
        # Every other id e^-40 below eos: once unmasked, eos is the whole nucleus, whatever the draw (with eos only
        # the likeliest, at half the mass, a sixth token came out in CI one time in many).
        scores = logp - 40.0
        scores[lm.eos] = 0.0
        return scores

    # Seeded: the other stop ids stay open before min_len, and an unseeded draw took one about once in 2,000 runs.
    stream = _start(lm, vectors, seed=0, max_ratio=8)
    logp = lm.forward_step([stream])[0]
    stream.min_len = 5
    made = 0
    while True:
        token = lm.choose(stream, favour_eos(logp))
        if token is None:
            break
        made += 1
        logp = lm.forward_step([stream])[0]
    assert made == 5 and stream.finished


def test_forced_length_makes_exactly_that_many_tokens(model: Any, vectors: dict[str, Any]) -> None:
    """The benches' switch: every stop id masked and the bounds set at the prefill."""
    lm = model.llm
    lm.forced_length = 7
    try:
        streams = [_start(lm, vectors, variant=v, seed=v, max_ratio=1) for v in range(3)]
        while live := [s for s in streams if not s.finished]:
            lm.step(live)
    finally:
        lm.forced_length = None
    assert [len(s.tokens) for s in streams] == [7, 7, 7]
    assert not any(t in lm.stop_tokens for s in streams for t in s.tokens)


def test_sampling_keeps_the_global_rng(model: Any, vectors: dict[str, Any]) -> None:
    lm = model.llm
    state = torch.get_rng_state()
    a = list(lm.generate(_start(lm, vectors, seed=9)))
    assert torch.equal(torch.get_rng_state(), state)
    assert a == list(lm.generate(_start(lm, vectors, seed=9)))


# -- the decode step as one graph -----------------------------------------------------------------------------------


def test_decode_step_compiles_as_one_graph(model: Any, vectors: dict[str, Any]) -> None:
    """``torch.compile(fullgraph=True)`` of the whole decode step (forward, sampler, state update): no graph break,
    so no host sync, which is what a CUDA graph needs. Compiled, it makes the eager step's tokens."""
    lm = model.llm
    streams = [_start(lm, vectors, variant=v, seed=v, max_ratio=8) for v in range(3)]
    _prefill_and_decode(lm, streams, 1)
    slots = torch.tensor([s.slot for s in streams] + [SCRATCH])
    uniforms = _uniforms(4, 0, lm.llm_decoder.out_features)
    length = length_bucket(max(s.position for s in streams) + 1, KV_BLOCK)
    before = _pool_state(lm.pool)
    torch._dynamo.reset()
    # Dynamo's trace is what finds graph breaks; the "eager" backend skips inductor's C++ build (inductor compiles it
    # too and makes the same tokens, in about 90 s on a 2-core machine: too slow for every run).
    compiled = torch.compile(lm.decode_sample, fullgraph=True, dynamic=False, backend="eager")
    with torch.inference_mode():
        eager = lm.decode_sample(lm.pool.current, slots, length, uniforms)
        after = _pool_state(lm.pool)
        _restore(lm.pool, before)
        got = compiled(lm.pool.current, slots, length, uniforms)
    assert torch.equal(got, eager)
    assert torch.equal(lm.pool.lengths, after["lengths"]) and torch.equal(lm.pool.window, after["window"])


# -- settings and dtype ---------------------------------------------------------------------------------------------


def test_cuda_graphs_setting_is_ignored_on_the_cpu(serving_service: Any) -> None:
    from rtvoice.engine.settings import EngineSettings

    assert EngineSettings.model_fields["cosyvoice_cuda_graphs"].default is True
    runner = serving_service.runner
    assert runner.device.type == "cpu" and not runner.cuda_graphs
    assert runner.model.llm.decode_graphs is None
    with pytest.raises(ValueError, match="CUDA"):
        runner.model.llm.use_decode_graphs(capture=True)


def test_lm_is_bf16_on_cuda_and_fp32_on_the_cpu(model: Any) -> None:
    assert llm_dtype(torch.device("cuda")) == torch.bfloat16
    assert llm_dtype(torch.device("cpu")) == torch.float32
    assert model.llm.dtype == torch.float32 and model.llm.pool.kv.dtype == torch.float32
