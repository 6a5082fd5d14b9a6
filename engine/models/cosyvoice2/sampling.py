"""Speech-token sampling: repetition-aware sampling (RAS, from VALL-E 2) over nucleus sampling.

Every random draw takes an explicit ``torch.Generator`` (one per stream), so streams are
reproducible from their seed and never touch or depend on the global RNG.
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
