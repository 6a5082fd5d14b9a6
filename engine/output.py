"""A stream's output: audio at the voice's rate in, int16 chunks at the client's rate and segment ends out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from rtvoice.engine.audio.pcm import to_int16
from rtvoice.engine.audio.resample import StreamResampler


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray
    """int16 mono samples."""
    sample_rate: int
    segment: int

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / self.sample_rate


@dataclass(frozen=True)
class SegmentDone:
    index: int
    text: str


class _End:
    """Queued last: the stream ended (how, the stream says)."""


_END = _End()


class AudioOutput:
    def __init__(self, voice_rate: int, sample_rate: int, max_queued_s: float, on_drained: Callable[[], None]) -> None:
        self.sample_rate = sample_rate
        self._resampler = StreamResampler(voice_rate, sample_rate)
        self._queue: asyncio.Queue[AudioChunk | SegmentDone | _End] = asyncio.Queue()
        self._on_drained = on_drained
        self.queued_s = 0.0
        """Audio queued and not yet taken by the client."""
        self.max_queued_s = max_queued_s
        self.ended = False

    def audio(self, audio: np.ndarray, segment: int) -> float:
        """Queue float32 audio at the voice's rate; returns the seconds that went out now (a resampler holds
        back a few milliseconds until the next audio or the end)."""
        return self._put(to_int16(self._resampler.process(audio)), segment)

    def segment_done(self, index: int, text: str) -> None:
        self._queue.put_nowait(SegmentDone(index, text))

    def flush(self, segment: int) -> float:
        """The resampler's last samples (the stream's input ended); returns their seconds."""
        return self._put(to_int16(self._resampler.process(np.zeros(0, dtype=np.float32), last=True)), segment)

    def _put(self, pcm: np.ndarray, segment: int) -> float:
        if not len(pcm):
            return 0.0
        chunk = AudioChunk(pcm, self.sample_rate, segment)
        self.queued_s += chunk.duration_s
        self._queue.put_nowait(chunk)
        return chunk.duration_s

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self._queue.put_nowait(_END)

    @property
    def full(self) -> bool:
        """True when the client is this far behind: make no more until it catches up (backpressure)."""
        return self.queued_s > self.max_queued_s

    async def events(self) -> AsyncIterator[AudioChunk | SegmentDone]:
        """Chunks and segment ends in order, until ``end``."""
        while True:
            item = await self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, AudioChunk):
                was_full = self.full
                self.queued_s -= item.duration_s
                if was_full and not self.full:
                    self._on_drained()
            yield item
