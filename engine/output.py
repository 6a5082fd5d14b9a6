"""A stream's output: audio at the voice's rate in; int16 chunks at the client's rate, words and segment ends out.

Words wait here until the audio that holds their start goes out, and then go just before it: a transport that
sends events in order sends each word no later than its audio. The client's time base is the samples it gets."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from rtvoice.engine.audio.pcm import to_int16
from rtvoice.engine.audio.resample import StreamResampler
from rtvoice.engine.words import WordTiming


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
        self._queue: asyncio.Queue[AudioChunk | SegmentDone | WordTiming | _End] = asyncio.Queue()
        self._words: deque[WordTiming] = deque()
        """Words whose audio has not gone out yet, in order."""
        self.samples = 0
        """Samples queued so far, at the client's rate."""
        self._on_drained = on_drained
        self.queued_s = 0.0
        """Audio queued and not yet taken by the client."""
        self.max_queued_s = max_queued_s
        self.ended = False

    def audio(self, audio: np.ndarray, segment: int) -> float:
        """Queue float32 audio at the voice's rate; returns the seconds that went out now (a resampler holds
        back a few milliseconds until the next audio or the end)."""
        return self._put(to_int16(self._resampler.process(audio)), segment)

    def words(self, words: list[WordTiming]) -> None:
        """Words to send before the audio that holds their start."""
        self._words.extend(words)

    def segment_done(self, index: int, text: str) -> None:
        self._queue.put_nowait(SegmentDone(index, text))

    def flush(self, segment: int) -> float:
        """The resampler's last samples (the stream's input ended); returns their seconds. Words still waiting
        (a start in the last samples, or in none) go before them."""
        last = to_int16(self._resampler.process(np.zeros(0, dtype=np.float32), last=True))
        while self._words:
            self._queue.put_nowait(self._words.popleft())
        return self._put(last, segment)

    def _put(self, pcm: np.ndarray, segment: int) -> float:
        if not len(pcm):
            return 0.0
        self.samples += len(pcm)
        end_s = self.samples / self.sample_rate
        while self._words and self._words[0].start_s < end_s:
            self._queue.put_nowait(self._words.popleft())
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

    async def events(self) -> AsyncIterator[AudioChunk | SegmentDone | WordTiming]:
        """Chunks, words and segment ends in order, until ``end``."""
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
