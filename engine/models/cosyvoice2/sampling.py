"""Speech-token sampling: repetition-aware sampling (RAS, from VALL-E 2) over nucleus sampling.

Every random draw takes an explicit ``torch.Generator`` (one per stream), so streams are
reproducible from their seed and never touch or depend on the global RNG.

``nucleus_sample`` and ``ras_sample`` are the reference, one stream at a time (each ends in a host sync);
``sample_batch`` is what the LM runs: the same candidates and distribution for a whole batch on the device, from
uniforms the caller draws from each stream's generator (tests/cosyvoice2/test_lm_slots.py compares the two).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import SamplingConfig


def new_generator(seed: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator: seeded when ``seed`` is given, else from OS entropy (never from the global RNG)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def nucleus_sample(logp: torch.Tensor, top_p: float, top_k: int, generator: torch.Generator) -> int:
    """Draw from the smallest set of most likely tokens whose mass reaches ``top_p`` (at most ``top_k``)."""
    probs, order = logp.softmax(dim=0).sort(descending=True, stable=True)
    mass_before = torch.cumsum(probs, dim=0) - probs
    # A token is kept while the mass of those before it is still under top_p; always keep one.
    keep = int((mass_before < top_p).sum().clamp(min=1, max=top_k))
    pick = torch.multinomial(probs[:keep], 1, replacement=True, generator=generator)
    return int(order[pick])


def ras_sample(logp: torch.Tensor, decoded: Sequence[int], cfg: SamplingConfig, generator: torch.Generator) -> int:
    """Nucleus-sample; if that token already fills ``tau_r`` of the last ``win_size`` tokens, draw
    again from the full distribution without it (breaks the loops token LMs fall into)."""
    token = nucleus_sample(logp, cfg.top_p, cfg.top_k, generator)
    if sum(1 for t in decoded[-cfg.win_size :] if t == token) >= cfg.win_size * cfg.tau_r:
        masked = logp.clone()
        masked[token] = float("-inf")
        token = int(torch.multinomial(masked.softmax(dim=0), 1, replacement=True, generator=generator))
    return token


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """[B, 1] index of each row's draw from ``weights`` [B, V] (unnormalised, non-negative) at ``uniform`` [B, 1] in
    [0, 1): the first index whose cumulative weight passes ``uniform`` x the row's total (a zero weight never)."""
    cdf = weights.cumsum(dim=-1)
    return (cdf <= uniform * cdf[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=weights.shape[-1] - 1)


def draws_per_step(vocab: int) -> int:
    """Uniforms :func:`sample_batch` takes per row: one per id (the nucleus draw) and one (the RAS redraw)."""
    return vocab + 1


def sample_batch(
    scores: torch.Tensor, uniforms: torch.Tensor, recent: torch.Tensor, cfg: SamplingConfig
) -> torch.Tensor:
    """:func:`ras_sample` for a batch, on the scores' device and without a host sync: [B] tokens from ``scores``
    [B, V] (log-probabilities, masked ones ``-inf``), ``uniforms`` [B, V + 1] in [0, 1) (each row's draws from its
    own generator, the same number every step, so a stream's random sequence does not depend on its tokens),
    ``recent`` [B, W] each row's last ``win_size`` tokens (-1 where none yet).

    The same candidates as :func:`nucleus_sample` (ties broken by the lower id, as its stable sort does) and the same
    distribution, drawn without ``torch.multinomial`` (which needs the nucleus size on the host), so the same seed
    draws other tokens. Only the top_k most likely are sorted (``topk``), not the vocabulary."""
    vocab = scores.shape[-1]
    probs = scores.softmax(dim=-1)
    top = probs.topk(max(1, min(cfg.top_k, vocab)), dim=-1).values  # [B, K], descending
    # As nucleus_sample: keep tokens while the mass before them is under top_p; at least one, at most top_k. The
    # sorted values, hence their cumulative mass, do not depend on how ties are ordered.
    keep = ((top.cumsum(dim=-1) - top) < cfg.top_p).sum(dim=-1, keepdim=True).clamp(min=1)  # [B, 1]
    last = top.gather(1, keep - 1)  # the smallest kept probability
    above = probs > last
    tied = probs == last
    # Of the tokens tied at the smallest kept probability, the lowest ids fill the nucleus (a stable sort's order).
    fill = keep - above.sum(dim=-1, keepdim=True)
    nucleus = above | (tied & (tied.long().cumsum(dim=-1) <= fill))
    # The nucleus draw as an exponential race (p / Exp(1), as torch.multinomial draws one sample), with each id's own
    # variate: a near-tie at the nucleus' edge that a batch's last bit flips changes the draw only if that token wins.
    race = (probs / -torch.log1p(-uniforms[:, :vocab])).masked_fill(~nucleus, -1.0)
    first = race.argmax(dim=-1, keepdim=True)  # [B, 1]
    # RAS: a token already filling tau_r of the window is drawn again from the whole distribution without it.
    repeats = (recent == first).sum(dim=-1, keepdim=True)
    rest = probs.scatter(1, first, 0.0)
    second = _inverse_cdf(rest, uniforms[:, vocab:])
    redraw = (repeats >= cfg.win_size * cfg.tau_r) & (rest.sum(dim=-1, keepdim=True) > 0)
    return torch.where(redraw, second, first)[:, 0]
