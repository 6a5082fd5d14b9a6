"""A stream's speed as frames: the encoder's durations at the voice's own length scale, scaled to 1/speed in all.

Piper's own way, a smaller length scale, cannot halve speech: its graph rounds every token's duration up to a whole
frame, and a pad token of a frame or two sits between every two phonemes, so half the length scale left ~64% of the
frames (``docs/decisions.md``). Here one factor scales every token's frames, rounded, with a floor of one frame
(as Piper's rounding up keeps every token), and is chosen so that the segment has 1/speed of its frames. Where even
one frame a token is too many (speeds above ~2), the running total is rounded instead, and a token may get none.

The encoder's frame-level outputs repeat each token's value for each of its frames (VITS expands them through a 0/1
path), so the frames at another pace are picked from the ones made, and nothing is run again.
"""

from __future__ import annotations

import numpy as np

_SEARCH_STEPS = 40
"""Halvings of the factor's interval: far below a frame's worth on any segment."""


def paced_durations(durations: np.ndarray, speed: float) -> np.ndarray:
    """Each token's frames at ``speed``, from ``durations`` (its frames at speed 1), summing to the sum of
    ``durations`` / speed, rounded: ``max(1, round(d × factor))`` for a spoken token (0 stays 0) with the factor that
    gives that sum, or, where one frame a token already exceeds it, the running total / speed rounded."""
    frames = durations.astype(np.float64)
    spoken = frames > 0
    target = np.floor(frames.sum() / speed + 0.5)
    if spoken.sum() > target:
        ends = np.floor(np.cumsum(frames) / speed + 0.5)
        return np.diff(ends, prepend=0.0).astype(np.int64)

    def scaled(factor: float) -> np.ndarray:
        return np.where(spoken, np.maximum(1.0, np.floor(frames * factor + 0.5)), 0.0)

    low, high = 0.0, 2.0 / speed
    while scaled(high).sum() < target:
        high *= 2
    for _ in range(_SEARCH_STEPS):
        middle = (low + high) / 2
        if scaled(middle).sum() < target:
            low = middle
        else:
            high = middle
    # Tokens of one length step up together (durations are whole frames): only as many as the sum needs do, spread.
    paced, above = scaled(low), scaled(high)
    stepping = np.flatnonzero(above > paced)
    needed = int(target - paced.sum())
    if needed > 0:
        paced[stepping[((np.arange(needed) + 0.5) * len(stepping) / needed).astype(np.int64)]] += 1
    return paced.astype(np.int64)


def frame_picks(durations: np.ndarray, paced: np.ndarray) -> np.ndarray:
    """For each frame at the pace of ``paced``, the index of a frame of the same token among those of ``durations``."""
    whole = durations.astype(np.int64)
    return np.repeat(np.cumsum(whole) - whole, paced)
