"""A speech stream: one request's record and its playback clock.

Transports push text (whole, or fragment by fragment), read events and cancel; the scheduler
asks the stream's voice session for steps and hands each result back through ``deliver``. The
stream keeps what the request is (voice, session, rate, segments, state) and its listener's
playback clock; text is cut by a ``Segmenter``, words are timed by a ``WordClock`` and audio is converted by an
``AudioOutput``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from rtvoice.engine.audio.stretch import TimeStretch
from rtvoice.engine.errors import InvalidRequest, StreamFailed
from rtvoice.engine.markup import MarkupError
from rtvoice.engine.models.base import Step, Voice, VoiceSession
from rtvoice.engine.output import AudioChunk, AudioOutput, SegmentDone
from rtvoice.engine.playback import PlaybackClock, Played
from rtvoice.engine.ssml import invalid_ssml
from rtvoice.engine.text import Planned, Segmenter, Silence, is_speakable
from rtvoice.engine.words import MarkTiming, Timed, WordClock, WordTiming

__all__ = [
    "AudioChunk",
    "Delivered",
    "MarkTiming",
    "SegmentDone",
    "SpeechStream",
    "StreamState",
    "StreamStats",
    "TextLimit",
    "WordTiming",
]

_ids = itertools.count(1)


@dataclass(frozen=True)
class StreamStats:
    ttfa_s: float | None
    audio_s: float
    compute_s: float
    segments: int
    late_chunks: int
    stall_s: float


@dataclass(frozen=True)
class Delivered:
    """What one step's result gave its stream."""

    audio_s: float
    played: Played | None
    """The playback clock's account of the audio; None when the step made none."""


@dataclass(frozen=True)
class TextLimit:
    """How much text one stream may be given in all, and the protocol's name for its text (for the error)."""

    max_chars: int
    param: str = "text"


class StreamState(Enum):
    OPEN = "open"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


class SpeechStream:
    def __init__(
        self,
        voice: Voice,
        session: VoiceSession,
        segmenter: Segmenter,
        sample_rate: int,
        wake: Callable[[], None],
        max_buffered_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        on_end: Callable[[SpeechStream], None] = lambda stream: None,
        trim_leading_silence: bool = False,
        text_limit: TextLimit | None = None,
        words: bool = False,
    ) -> None:
        """``wake`` is called when the stream has new work or room; ``on_end`` once, when it ends (any way);
        ``trim_leading_silence``: see ``AudioOutput``; ``text_limit``: what ``push_text`` holds all its text to;
        ``words``: its events include word timings and marks (``SynthesisRequest.words``)."""
        self.id = next(_ids)
        self.voice = voice
        self.session = session
        self.sample_rate = sample_rate
        self.state = StreamState.OPEN
        self.input_closed = False
        self.segments: list[str] = []
        self.compute_s = 0.0
        self.error: Exception | None = None
        self.text = ""
        """All the text pushed so far."""
        self._text_limit = text_limit
        self._segmenter = segmenter
        self._wake = wake
        self._on_end = on_end
        self._now = clock
        self._segments_done = 0
        self.created_at = clock()
        self.playback = PlaybackClock(self.created_at)
        self.output = AudioOutput(voice.info.sample_rate, sample_rate, max_buffered_s, wake, trim_leading_silence)
        self.words = WordClock(voice.info.sample_rate) if words else None
        """None for a stream that sends no words: nothing is timed, by the stream or its voice."""
        if not words:
            session.skip_timings()
        self._gains: list[float] = []
        """Each segment's gain (SSML's ``prosody volume``)."""
        self._stretch_rates: list[float] = []
        """Each segment's rate where its voice speaks at one rate (SSML's ``prosody rate``): its audio is stretched."""
        self._stretch: TimeStretch | None = None
        """The current segment's stretcher, when it has one."""
        self._pauses: dict[int, list[Silence]] = {}
        """Pauses waiting for the segments before them: by how many segments come before."""
        self._planned = False
        """Some speech or pause has been planned."""

    # -- input (transports) -------------------------------------------------------------------------

    def push_text(self, fragment: str) -> None:
        """More text; InvalidRequest (``input_too_long``) when it would take the stream past its text limit, and
        the fragment is dropped (what came before it is kept)."""
        limit = self._text_limit
        if limit is not None and len(self.text) + len(fragment) > limit.max_chars:
            raise InvalidRequest(
                f"the text would have {len(self.text) + len(fragment)} characters; the limit is {limit.max_chars} "
                "(this piece was dropped; what came before it is kept)",
                code="input_too_long",
                param=limit.param,
            )
        self.text += fragment
        self._add(self._read(self._segmenter.push, fragment))

    @property
    def speakable(self) -> bool:
        """Whether the text so far has anything to speak (letters or digits) or a pause to make."""
        return self._planned or is_speakable(self.text)

    @property
    def ignored(self) -> list[str]:
        """What the text asked for that was not done (an element its voice cannot do, one this server does not
        know), in order."""
        return self._segmenter.ignored

    def flush(self) -> None:
        self._add(self._segmenter.flush())

    def close_input(self) -> None:
        self._add(self._read(lambda _: self._segmenter.close(), ""))
        self.input_closed = True
        self._wake()

    def _read(self, read: Callable[[str], list[Planned]], fragment: str) -> list[Planned]:
        """The segmenter's reading of more text; markup that does not read ends the stream (nothing more of it is
        spoken) and is the client's error."""
        try:
            return read(fragment)
        except MarkupError as error:
            self.cancel()
            raise invalid_ssml(error, self._text_limit.param if self._text_limit is not None else "text") from error

    def _add(self, planned: list[Planned]) -> None:
        if not planned or self.closed:
            return
        self._planned = True
        if self.session.idle:  # nothing being synthesised: a silent listener waits for a first audio again
            self.playback.restart_if_silent(self._now())
        for item in planned:
            if isinstance(item, Silence):
                if self.session.idle and self._segments_done == len(self.segments):
                    self._pause(item)
                else:
                    self._pauses.setdefault(len(self.segments), []).append(item)
                continue
            self.segments.append(item.text)
            self._gains.append(item.prosody.volume)
            if self.words is not None:
                self.words.add_segment(item)
            native = self.voice.info.varies_rate
            self._stretch_rates.append(1.0 if native else item.prosody.rate)
            self.session.add_segment(item.text, item.prosody.rate if native else 1.0)
        self._wake()

    def _pause(self, pause: Silence) -> float:
        """Silence the text asked for, out now (its segments before it are all out)."""
        samples = round(pause.seconds * self.voice.info.sample_rate)
        if self.words is not None:
            self.output.words(self.words.pause(samples, pause.marks))
        if not samples:
            return 0.0
        audio_s = self.output.silence(np.zeros(samples, dtype=np.float32), max(0, self._segments_done - 1))
        if audio_s:
            self.playback.play(audio_s, self._now())
        return audio_s

    def cancel(self) -> None:
        """Stop now: pending work is dropped and the scheduler frees the stream's slot."""
        if self.closed:
            return
        self._end(StreamState.CANCELLED)
        self._wake()

    # -- output (transports) ------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[AudioChunk | SegmentDone | Timed]:
        """Audio chunks, words (each just before the chunk that holds its start) and segment ends, in order, until
        the stream ends; raises StreamFailed on failure."""
        async for event in self.output.events():
            yield event
        if self.state is StreamState.FAILED:
            raise StreamFailed(f"synthesis failed: {self.error}", code="synthesis_failed")

    async def audio(self) -> AsyncIterator[np.ndarray]:
        """Just the int16 PCM chunks."""
        async for event in self.events():
            if isinstance(event, AudioChunk):
                yield event.pcm

    @property
    def emitted_s(self) -> float:
        """Seconds of audio made so far."""
        return self.playback.audio_s

    @property
    def first_audio_at(self) -> float | None:
        """When the first audio went out (``time.monotonic``); None before."""
        return self.playback.first_audio_at

    def stats(self) -> StreamStats:
        first = self.playback.first_audio_at
        return StreamStats(
            ttfa_s=None if first is None else first - self.created_at,
            audio_s=self.playback.audio_s,
            compute_s=self.compute_s,
            segments=self._segments_done,
            late_chunks=self.playback.late_chunks,
            stall_s=self.playback.stall_s,
        )

    # -- the scheduler's side -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is not StreamState.OPEN

    @property
    def throttled(self) -> bool:
        """The client is far behind: make no more until it catches up."""
        return self.output.full

    def deliver(self, step: Step, result: object, compute_s: float, now: float) -> Delivered:
        """Apply a finished step: the session takes the result, the audio it releases goes out."""
        self.compute_s += compute_s
        audio = self.session.complete(step, result)
        audio, rate = self._stretched(audio, ends_segment=self.session.segments_done > self._segments_done)
        if self.words is not None:
            self.output.words(self.words.timings(self.session.take_timings()))
        played = None
        audio_s = 0.0
        if audio is not None and len(audio):
            gain = self._gains[self._segments_done] if self._segments_done < len(self._gains) else 1.0
            if gain != 1.0:
                audio = audio * np.float32(gain)
            if self.words is not None:
                length_s = self.session.segment_length_s()
                self.output.words(self.words.audio(len(audio), None if length_s is None else length_s / rate))
            # The listener's clock counts what went out: a resampler holds back a few milliseconds.
            audio_s = self.output.audio(audio, self._segments_done)
            if audio_s:
                played = self.playback.play(audio_s, now)
        while self._segments_done < self.session.segments_done:
            if self.words is not None:
                self.output.words(self.words.segment_done())
            self.output.segment_done(self._segments_done, self.segments[self._segments_done])
            self._segments_done += 1
            for pause in self._pauses.pop(self._segments_done, []):
                audio_s += self._pause(pause)
        return Delivered(audio_s, played)

    def _stretched(self, audio: np.ndarray | None, ends_segment: bool) -> tuple[np.ndarray | None, float]:
        """The current segment's audio at its own rate, for a voice that speaks at one rate; and that rate."""
        index = self._segments_done
        rate = self._stretch_rates[index] if index < len(self._stretch_rates) else 1.0
        if rate == 1.0:
            return audio, rate
        if self._stretch is None:
            self._stretch = TimeStretch(rate, self.voice.info.sample_rate)
        stretched = self._stretch.process(audio if audio is not None else np.zeros(0, np.float32), last=ends_segment)
        if ends_segment:
            self._stretch = None
        return stretched, rate

    def finish(self) -> None:
        """All input is synthesised."""
        if self.closed:
            return
        self.output.flush(max(0, self._segments_done - 1))
        self._end(StreamState.DONE)

    def fail(self, error: Exception) -> None:
        if self.closed:
            return
        self.error = error
        self._end(StreamState.FAILED)

    def _end(self, state: StreamState) -> None:
        self.state = state
        self.output.end()
        self._on_end(self)
