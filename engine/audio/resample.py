"""Streaming sample-rate conversion with soxr."""

from __future__ import annotations

import numpy as np
import soxr

SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


class StreamResampler:
    """Resamples one stream chunk by chunk; a pass-through when the rates match."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")

    def process(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next chunk; ``last`` flushes what the filter still holds."""
        if self._stream is None:
            return audio
        return self._stream.resample_chunk(np.ascontiguousarray(audio, dtype=np.float32), last=last)


def resample(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Resample a whole signal."""
    if in_rate == out_rate:
        return audio
    return soxr.resample(audio, in_rate, out_rate)
