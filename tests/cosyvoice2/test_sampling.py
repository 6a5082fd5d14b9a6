"""Token sampling: reproducible per stream, independent of (and invisible to) the global RNG."""

from __future__ import annotations

from typing import Any

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2.config import SamplingConfig  # noqa: E402
from rtvoice.engine.models.cosyvoice2.sampling import nucleus_sample, ras_sample  # noqa: E402


def _decode(model: Any, vectors: dict[str, Any], seed: int) -> list[int]:
    stream = model.llm.start(
        vectors["llm_text"],
        vectors["llm_prompt_text"],
        vectors["prompt_tokens"],
        generator=torch.Generator().manual_seed(seed),
        max_token_text_ratio=3,
    )
    return list(model.llm.generate(stream))


def test_same_seed_same_tokens(model: Any, vectors: dict[str, Any]) -> None:
    a = _decode(model, vectors, seed=7)
    assert a and a == _decode(model, vectors, seed=7)
    assert a != _decode(model, vectors, seed=8)


def test_sampler_ignores_and_keeps_global_rng(model: Any, vectors: dict[str, Any]) -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = _decode(model, vectors, seed=3)
    assert torch.equal(torch.get_rng_state(), state), "sampling advanced the global RNG"
    torch.manual_seed(12345)
    assert _decode(model, vectors, seed=3) == a


def test_interleaved_streams_match_solo_runs(model: Any, vectors: dict[str, Any]) -> None:
    """Stream state (cache, tokens, RNG) is per stream: stepping two together changes nothing."""
    solo = [_decode(model, vectors, seed=s) for s in (1, 2)]
    streams = [
        model.llm.start(
            vectors["llm_text"],
            vectors["llm_prompt_text"],
            vectors["prompt_tokens"],
            generator=torch.Generator().manual_seed(s),
            max_token_text_ratio=3,
        )
        for s in (1, 2)
    ]
    while not all(s.finished for s in streams):
        live = [s for s in streams if not s.finished]
        for s, logp in zip(live, model.llm.forward_step(live), strict=True):
            model.llm.choose(s, logp)
    assert [s.tokens for s in streams] == solo


def test_nucleus_keeps_top_p_mass_and_top_k() -> None:
    logp = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    g = torch.Generator().manual_seed(0)
    # mass before token 2 is 0.75 < 0.8, so tokens 0..2 are candidates; token 3 never is
    drawn = {nucleus_sample(logp, top_p=0.8, top_k=25, generator=g) for _ in range(300)}
    assert drawn == {0, 1, 2}
    assert {nucleus_sample(logp, top_p=0.8, top_k=1, generator=g) for _ in range(50)} == {0}


def test_ras_resamples_a_repeated_token() -> None:
    cfg = SamplingConfig(top_p=0.8, top_k=1, win_size=10, tau_r=0.1)
    logp = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    g = torch.Generator().manual_seed(0)
    assert ras_sample(logp, [1, 2], cfg, g) == 0
    # token 0 (the only nucleus candidate) is already in the window: it is excluded from the redraw
    assert all(ras_sample(logp, [0], cfg, g) != 0 for _ in range(50))


def test_hift_random_source_uses_its_generator(model: Any, vectors: dict[str, Any]) -> None:
    mel = vectors["flow_offline_mel"][:, :, :20]
    model.hift.m_source.random_source = True
    try:
        state = torch.get_rng_state()
        with torch.inference_mode():
            a, _ = model.hift(mel, generator=torch.Generator().manual_seed(5))
            b, _ = model.hift(mel, generator=torch.Generator().manual_seed(5))
            c, _ = model.hift(mel, generator=torch.Generator().manual_seed(6))
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        model.hift.m_source.random_source = False
    assert torch.equal(a, b) and not torch.equal(a, c)
