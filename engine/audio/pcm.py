"""PCM sample conversion and the cross-fade that joins overlapping chunks."""

from __future__ import annotations

import numpy as np

INT16_MAX = 32767


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float audio in [-1, 1] to int16 samples, clipping what lies outside."""
    return np.clip(np.rint(audio * INT16_MAX), -INT16_MAX, INT16_MAX).astype(np.int16)


def to_float32(pcm: np.ndarray) -> np.ndarray:
    """int16 samples to float32 in [-1, 1]."""
    return pcm.astype(np.float32) / INT16_MAX


def hamming_crossfade(tail: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Join the end of one chunk with the start of the next where both cover the same samples.

    The two halves of a Hamming window of twice the overlap weigh the incoming
    and outgoing audio, as CosyVoice's ``fade_in_out`` does, but normalised to
    sum to one: the raw halves sum to about 1.08, which would lift every
    overlap by 8% where the two chunks agree.
    """
    overlap = len(tail)
    if overlap == 0:
        return head[:0]
    window = np.hamming(2 * overlap)
    fade_in, fade_out = window[:overlap], window[overlap:]
    total = fade_in + fade_out
    return (head[:overlap] * (fade_in / total) + tail * (fade_out / total)).astype(np.float32)


def leading_silence(pcm: np.ndarray, threshold: int) -> int:
    """How many samples at the start of int16 ``pcm`` stay below ``threshold`` in magnitude (all, when all do)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) >= threshold)
    return int(loud[0]) if len(loud) else len(pcm)
