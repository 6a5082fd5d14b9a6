"""How many context frames a chunk of a stage needs, measured on the voice's own audio.

``graph.context_frames`` gives the reach of every convolution in full: an upper bound, at which a
chunked run equals a whole one. The far taps of those convolutions barely move the output, so a
chunk with less context matches the whole run to well within what anyone hears, and costs less:
context is paid on both sides of every flow window and decoder chunk, and the small chunks of a
start pay it most. So each stage takes the least context at which a sentence made in the plan's
smallest chunks differs from its whole run by no more than ``TOLERANCE_DB`` below its level.

Both stages are judged by the audio: the decoder amplifies the flow's small errors, so a flow context
judged by its latent alone falls short of what the listener gets (figures: ``docs/decisions.md``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from rtvoice.engine.models.piper.plan import smallest

TOLERANCE_DB = 100.0
"""How far below the sentence's mean power the difference of the sentence made in the plan's smallest chunks must lie
(in dB): well past the tests' 60 dB for the same speech, as chunk sizes follow the load and some flow windows are
smaller still (figures: ``docs/decisions.md``)."""

MEASURE_VERSION = 2
"""Goes up whenever what the measurement computes changes, so that contexts an older rtvoice kept are measured again
(1: each stage's own output on 32-frame chunks)."""

log = logging.getLogger(__name__)

RunStage = Callable[[int, int], np.ndarray]
"""Runs a stage on input frames ``[lo, hi)`` of the sentence: its output, ``per_frame`` values per frame along the
last axis."""


def below_db(power: float, reference: np.ndarray, test: np.ndarray) -> float:
    """How far below ``power`` (a mean square) the mean square of ``test - reference`` lies, in dB (``inf`` when they
    are equal)."""
    difference = float(np.mean((reference.astype(np.float64) - test) ** 2))
    if difference == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(power / difference)) if power > 0 else float("-inf")


Map = Callable[[Callable[[tuple[int, int]], np.ndarray], Iterable[tuple[int, int]]], Iterator[np.ndarray]]
"""``map`` or a thread pool's: how the chunks of ``tiled`` are run (onnxruntime lets go of the GIL while it runs)."""


def tiled(
    run: RunStage, frames: int, per_frame: int, chunk_frames: int, context: int, map_chunks: Map = map
) -> np.ndarray:
    """A stage's output for all ``frames`` of a sentence, made in chunks of ``chunk_frames`` that tile it, each run
    with ``context`` frames on both sides (fewer at the sentence's ends, as the plan does)."""

    def chunk(span: tuple[int, int]) -> np.ndarray:
        start, end = span
        lo, hi = max(0, start - context), min(frames, end + context)
        return run(lo, hi)[..., (start - lo) * per_frame : (end - lo) * per_frame]

    spans = [(start, min(frames, start + chunk_frames)) for start in range(0, frames, chunk_frames)]
    return np.concatenate(list(map_chunks(chunk, spans)), axis=-1)


def least_context(
    streamed: Callable[[int], np.ndarray], whole: np.ndarray, bound: int, tolerance_db: float = TOLERANCE_DB
) -> int:
    """The least context (0..``bound``) at which ``streamed(context)``, a sentence made in chunks with that context,
    differs from ``whole``, its whole run, by ``tolerance_db`` below its mean power.

    The search starts at the bound, which matches without a trial (each chunk sees what the whole run does), and
    steps down by 1, 2, 4, ... frames to the first context that does not match, then halves the gap: the least
    context lies a few frames under the reach, so this tries fewer contexts than halving from zero."""
    power = float(np.mean(whole.astype(np.float64) ** 2))

    @functools.cache  # the halving asks again of the contexts the steps tried
    def matches(context: int) -> bool:
        return context >= bound or below_db(power, whole, streamed(context)) >= tolerance_db

    matching, step = bound, 1
    while matching > 0 and matches(trial := max(0, matching - step)):
        matching, step = trial, 2 * step
    return 0 if matching == 0 else smallest(trial, matching, matches)
