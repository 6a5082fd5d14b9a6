"""A speech stream: one request's text in, its audio out, and everything known about its progress.

Transports push text (whole, or fragment by fragment) and read events; the
scheduler decides when the stream's next model step runs and hands results
back through ``deliver``. All per-request state lives here and in the voice
session the stream owns.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from rtvoice.engine.audio.pcm import to_int16
from rtvoice.engine.audio.resample import StreamResampler
from rtvoice.engine.errors import StreamFailed
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import Step, Voice, VoiceSession
from rtvoice.engine.text import Segmenter

_ids = itertools.count(1)


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


@dataclass(frozen=True)
class StreamStats:
    ttfa_s: float | None
    audio_s: float
    compute_s: float
    segments: int
    late_chunks: int
    stall_s: float


class StreamState(Enum):
    QUEUED = "queued"
    ACTIVE = "active"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


_END = object()


class SpeechStream:
    def __init__(
        self,
        voice: Voice,
        session: VoiceSession,
        segmenter: Segmenter,
        sample_rate: int,
        metrics: Metrics,
        wake: Callable[[], None],
        max_buffered_s: float = 20.0,
    ) -> None:
        self.id = next(_ids)
        self.voice = voice
        self.session = session
        self.segmenter = segmenter
        self.sample_rate = sample_rate
        self.metrics = metrics
        self._wake = wake
        self.max_buffered_s = max_buffered_s
        self._resampler = StreamResampler(voice.info.sample_rate, sample_rate)
        self._events: asyncio.Queue[object] = asyncio.Queue()
        self.state = StreamState.QUEUED
        self.in_flight = False
        self.input_closed = False
        self.segments: list[str] = []
        self._segments_done = 0

        now = time.monotonic()
        self.created_at = now
        self.waiting_since: float | None = None
        """When the stream got text but has no audio out for it yet (priority for first audio)."""
        self.first_audio_at: float | None = None
        self.runs_out_at: float | None = None
        """When a listener who plays from the first byte runs out of audio: the stream's deadline."""
        self.emitted_s = 0.0
        self.consumed_s = 0.0
        self.compute_s = 0.0
        self.late_chunks = 0
        self.stall_s = 0.0
        self.error: Exception | None = None

    # -- input ------------------------------------------------------------------------------------

    def push_text(self, fragment: str) -> None:
        self._add(self.segmenter.push(fragment))

    def flush(self) -> None:
        self._add(self.segmenter.flush())

    def close_input(self) -> None:
        self.flush()
        self.input_closed = True
        self._wake()

    def _add(self, segments: list[str]) -> None:
        if not segments or self.closed:
            return
        if self.session.idle and not self.in_flight:
            # Nothing is playing: what follows is a fresh utterance with its own first audio.
            self.waiting_since = time.monotonic()
            self.runs_out_at = None
        for text in segments:
            self.segments.append(text)
            self.session.add_segment(text)
        self._wake()

    def cancel(self) -> None:
        """Stop now: pending work is dropped and the scheduler frees the stream's slot."""
        if self.closed:
            return
        self.state = StreamState.CANCELLED
        self.metrics.streams.labels("cancelled").inc()
        self._events.put_nowait(_END)
        self._wake()

    # -- output -----------------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[AudioChunk | SegmentDone]:
        """Audio chunks and segment ends, in order, until the stream ends; raises StreamFailed on failure."""
        while True:
            item = await self._events.get()
            if item is _END:
                if self.state is StreamState.FAILED:
                    raise StreamFailed(f"synthesis failed: {self.error}", code="synthesis_failed")
                return
            if isinstance(item, AudioChunk):
                was_throttled = self.throttled
                self.consumed_s += item.duration_s
                if was_throttled and not self.throttled:
                    self._wake()
            yield item  # type: ignore[misc]

    async def audio(self) -> AsyncIterator[np.ndarray]:
        """Just the int16 PCM chunks."""
        async for event in self.events():
            if isinstance(event, AudioChunk):
                yield event.pcm

    # -- scheduler side ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state in (StreamState.DONE, StreamState.CANCELLED, StreamState.FAILED)

    @property
    def buffered_s(self) -> float:
        return self.emitted_s - self.consumed_s

    @property
    def throttled(self) -> bool:
        """True when the client is this far behind: produce no more until it catches up."""
        return self.buffered_s > self.max_buffered_s

    @property
    def finished(self) -> bool:
        return self.input_closed and self.session.idle and not self.in_flight

    def priority(self, now: float, urgent_margin_s: float) -> tuple[int, float]:
        """Lower runs first.

        0. streams whose listener runs out of audio within the margin, by deadline (a gap is audible);
        1. streams owing their first audio, by arrival (time to first audio);
        2. the others, by deadline.
        """
        if self.runs_out_at is None:
            return (1, self.waiting_since if self.waiting_since is not None else self.created_at)
        if self.runs_out_at - now < urgent_margin_s:
            return (0, self.runs_out_at)
        return (2, self.runs_out_at)

    def deliver(self, step: Step, result: object, compute_s: float) -> None:
        """Apply a finished model step; queue the audio it released."""
        self.compute_s += compute_s
        audio = self.session.complete(step, result)
        if audio is not None and len(audio):
            self._emit(audio)
        done = self.session.segments_done
        while self._segments_done < done:
            self._events.put_nowait(SegmentDone(self._segments_done, self.segments[self._segments_done]))
            self._segments_done += 1

    def _emit(self, audio: np.ndarray, last: bool = False) -> None:
        pcm = to_int16(self._resampler.process(audio, last=last))
        duration = len(audio) / self.voice.info.sample_rate
        now = time.monotonic()
        if self.runs_out_at is None:
            if self.first_audio_at is None:
                self.first_audio_at = now
                self.metrics.ttfa.labels(self.voice.info.id).observe(now - (self.waiting_since or self.created_at))
            self.runs_out_at = now
        elif now > self.runs_out_at:
            self.late_chunks += 1
            self.stall_s += now - self.runs_out_at
            self.metrics.late_chunks.inc()
            self.metrics.stall_seconds.inc(now - self.runs_out_at)
            self.runs_out_at = now
        self.runs_out_at += duration
        self.emitted_s += duration
        self.metrics.audio_seconds.labels(self.voice.info.id).inc(duration)
        if len(pcm):
            self._events.put_nowait(AudioChunk(pcm, self.sample_rate, self._segments_done))

    def finish(self) -> None:
        if self.closed:
            return
        tail = to_int16(self._resampler.process(np.zeros(0, dtype=np.float32), last=True))
        if len(tail):
            self._events.put_nowait(AudioChunk(tail, self.sample_rate, max(0, self._segments_done - 1)))
        self.state = StreamState.DONE
        self.metrics.streams.labels("done").inc()
        if self.emitted_s > 0:
            self.metrics.real_time_factor.labels(self.voice.info.id).observe(self.compute_s / self.emitted_s)
        self._events.put_nowait(_END)

    def fail(self, error: Exception) -> None:
        if self.closed:
            return
        self.error = error
        self.state = StreamState.FAILED
        self.metrics.streams.labels("failed").inc()
        self._events.put_nowait(_END)

    def stats(self) -> StreamStats:
        ttfa = None
        if self.first_audio_at is not None:
            ttfa = self.first_audio_at - self.created_at
        return StreamStats(
            ttfa_s=ttfa,
            audio_s=self.emitted_s,
            compute_s=self.compute_s,
            segments=self._segments_done,
            late_chunks=self.late_chunks,
            stall_s=self.stall_s,
        )
