"""How many context frames a chunk of a stage needs, measured on the voice's own output.

``graph.context_frames`` gives the reach of every convolution in full: an upper bound, at which a
chunked run equals a whole one. The far taps of those convolutions barely move the output, so a
chunk with less context matches the whole run to well within what anyone hears, and costs less:
context is paid on both sides of every flow window and decoder chunk, and the small chunks of a
start pay it most. So each stage takes the least context at which chunks cut from a sentence differ
from its whole run by no more than ``TOLERANCE_DB`` below the sentence's level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rtvoice.engine.models.piper.plan import smallest

TOLERANCE_DB = 90.0
"""How far below the sentence's mean power the difference of every trial chunk must lie (in dB). Chunk sizes follow
the load, so two runs of one seed chunk differently; at 70 dB (on the embedded voice, flow 19) two such runs of a
sentence differed by only 53 dB overall, audible to no one but short of the 60 dB the tests take as the same speech.
At 90 (flow 21, decoder 10) a streamed sentence is 85 dB or more from its whole run."""
CHUNK_FRAMES = 32
"""Frames each trial chunk makes; the chunks tile the sentence, so that every part of it is cut somewhere."""

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


def least_context(run: RunStage, whole: np.ndarray, frames: int, per_frame: int, bound: int,
                  tolerance_db: float = TOLERANCE_DB) -> int:
    """The least context (0..``bound``) at which every trial chunk of the sentence's ``frames`` differs from
    ``whole``, the stage's output for all of them, by ``tolerance_db`` below its mean power; ``bound`` when the
    sentence is too short to tell."""
    spans = trial_spans(frames, bound)
    if not spans:
        return bound
    power = float(np.mean(whole.astype(np.float64) ** 2))

    def matches(context: int) -> bool:
        for lo, hi in spans:
            made = run(lo - context, hi + context)[..., context * per_frame: (context + hi - lo) * per_frame]
            if below_db(power, whole[..., lo * per_frame: hi * per_frame], made) < tolerance_db:
                return False
        return True

    # The full reach is what each chunk sees in the whole run: it matches without a trial.
    return smallest(0, bound, lambda context: context >= bound or matches(context))


def trial_spans(frames: int, bound: int) -> Sequence[tuple[int, int]]:
    """Chunks of ``CHUNK_FRAMES`` that tile the sentence but for ``bound`` frames at both ends (room for their
    context); none when it is too short for one."""
    return [(start, start + CHUNK_FRAMES) for start in range(bound, frames - bound - CHUNK_FRAMES + 1, CHUNK_FRAMES)]
