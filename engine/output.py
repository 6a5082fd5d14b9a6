"""A stream's output: audio at the voice's rate in; int16 chunks at the client's rate, words and segment ends out.

Words wait here until the audio that holds their start goes out, and then go just before it: a transport that
sends events in order sends each word no later than its audio. The client's time base is the samples it gets."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import numpy as np

from rtvoice.engine.audio.pcm import INT16_MAX, leading_silence, to_int16
from rtvoice.engine.audio.resample import StreamResampler
from rtvoice.engine.words import MarkTiming, Timed


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


SILENCE_THRESHOLD = round(INT16_MAX * 10 ** (-60 / 20))
"""-60 dBFS: below this a voice's leading samples are silence (its speech starts tens of dB above)."""
ONSET_LEAD_S = 0.002
"""Kept before the first loud sample when leading silence is trimmed, so the onset is not cut."""
MAX_TRIMMED_S = 0.5
"""Trimming gives up after this much: a voice that starts this quietly is speaking, not silent."""


class AudioOutput:
    def __init__(
        self,
        voice_rate: int,
        sample_rate: int,
        max_queued_s: float,
        on_drained: Callable[[], None],
        trim_leading_silence: bool = False,
    ) -> None:
        """``trim_leading_silence``: drop the silence a voice makes before its first sound (for a live player,
        where it is only delay); the words' times move with the audio."""
        self.sample_rate = sample_rate
        self._resampler = StreamResampler(voice_rate, sample_rate)
        self._queue: asyncio.Queue[AudioChunk | SegmentDone | Timed | _End] = asyncio.Queue()
        self._words: deque[Timed] = deque()
        """Words whose audio has not gone out yet, in order."""
        self.samples = 0
        """Samples queued so far, at the client's rate."""
        self._on_drained = on_drained
        self.queued_s = 0.0
        """Audio queued and not yet taken by the client."""
        self.max_queued_s = max_queued_s
        self.ended = False
        self._trimming = trim_leading_silence
        self.trimmed_samples = 0
        """Leading silence dropped, at the client's rate."""

    def audio(self, audio: np.ndarray, segment: int) -> float:
        """Queue float32 audio at the voice's rate; returns the seconds that went out now (a resampler holds
        back a few milliseconds until the next audio or the end)."""
        return self._put(to_int16(self._resampler.process(audio)), segment)

    def words(self, words: list[Timed]) -> None:
        """Words (and marks) to send before the audio that holds their start."""
        self._words.extend(words)

    def silence(self, audio: np.ndarray, segment: int) -> float:
        """A pause the text asked for: never trimmed as leading silence (it was asked for), and the voice's own
        leading silence after it is kept too."""
        self._trimming = False
        return self.audio(audio, segment)

    def segment_done(self, index: int, text: str) -> None:
        self._queue.put_nowait(SegmentDone(index, text))

    def flush(self, segment: int) -> float:
        """The resampler's last samples (the stream's input ended); returns their seconds. Words still waiting
        (a start in the last samples, or in none) go before them."""
        last = to_int16(self._resampler.process(np.zeros(0, dtype=np.float32), last=True))
        while self._words:
            self._queue.put_nowait(self._shifted(self._words.popleft()))
        return self._put(last, segment)

    def _trim(self, pcm: np.ndarray) -> np.ndarray:
        silent = leading_silence(pcm, SILENCE_THRESHOLD)
        if silent < len(pcm):
            silent = max(0, silent - round(ONSET_LEAD_S * self.sample_rate))
            self._trimming = False
        silent = min(silent, max(0, round(MAX_TRIMMED_S * self.sample_rate) - self.trimmed_samples))
        if self.trimmed_samples + silent >= round(MAX_TRIMMED_S * self.sample_rate):
            self._trimming = False
        self.trimmed_samples += silent
        return pcm[silent:]

    def _shifted(self, word: Timed) -> Timed:
        if not self.trimmed_samples:
            return word
        trimmed_s = self.trimmed_samples / self.sample_rate
        if isinstance(word, MarkTiming):
            return replace(word, start_s=max(0.0, word.start_s - trimmed_s))
        return replace(word, start_s=max(0.0, word.start_s - trimmed_s), end_s=max(0.0, word.end_s - trimmed_s))

    def _put(self, pcm: np.ndarray, segment: int) -> float:
        if self._trimming:
            pcm = self._trim(pcm)
        if not len(pcm):
            return 0.0
        self.samples += len(pcm)
        end_s = (self.samples + self.trimmed_samples) / self.sample_rate
        while self._words and self._words[0].start_s < end_s:
            self._queue.put_nowait(self._shifted(self._words.popleft()))
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

    async def events(self) -> AsyncIterator[AudioChunk | SegmentDone | Timed]:
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
