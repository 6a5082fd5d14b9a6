"""A WHEP session's playback queue: its utterances, each through the engine, one after another, onto its audio track.

A request's text and voice are checked when it arrives. When nothing else is
pending its engine stream opens at once, so an overloaded server refuses it
at once too. A request that arrives while another is speaking waits its
turn: its stream opens when the one before has been synthesised (about
``MAX_QUEUED_AUDIO_S`` before that one stops playing, so speech runs back to
back), and only then may it be refused as overloaded, by an ``error`` event.
Opening late keeps the engine's playback deadlines true: a stream's audio
plays from its first chunk on. Each word goes out as a ``word`` event when the
frame that holds its start leaves for the player (a mark before that frame).
``cancel`` stops the utterance playing and drops the queued ones: their streams
are cancelled and the track falls silent from its next 20 ms frame; each one's
``cancelled`` says what was played out (audio time, last whole word).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rtvoice.app.errors import HttpError, error_fields
from rtvoice.app.whep.mediastreams import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE, SpeechTrack
from rtvoice.app.whep.messages import SpeakRequest, event
from rtvoice.app.words import delivered, mark_fields, word_fields
from rtvoice.engine.audio.framing import FrameBuffer
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, StreamFailed
from rtvoice.engine.models.base import SynthesisOptions, VoiceInfo
from rtvoice.engine.request import FieldNames, SynthesisRequest
from rtvoice.engine.stream import AudioChunk, MarkTiming, SpeechStream, WordTiming

MAX_QUEUED_AUDIO_S = 2.0
"""Speech the queue puts on the track ahead of playback; the engine's own backpressure does the rest."""

_ids = itertools.count(1)


class QueueFull(HttpError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this session already has {limit} utterances playing or queued; wait or cancel", code="queue_full"
        )
        self.retry_after_s = 1


Emit = Callable[[str, "object | None"], None]
"""Send an event's JSON to a channel (None: every open channel of the session)."""


@dataclass(eq=False)
class QueuedUtterance:
    id: str
    request: SynthesisRequest
    voice: VoiceInfo
    """Who speaks it (checked when it arrived)."""
    stream: SpeechStream | None
    """Opened when the utterance is next to play (at once when nothing else is pending)."""
    reply_to: object | None
    """The DataChannel the request came on; None for ``/speak`` (events go to every open channel)."""
    accepted_at: float = field(default_factory=time.monotonic)
    state: str = "queued"
    """queued -> speaking -> done | cancelled | failed"""
    first_frame_at: float | None = None
    start_frame: int = 0
    frames: int = 0
    words_played: list[WordTiming] = field(default_factory=list)
    """Words whose first frame has left for the player."""


class PlaybackQueue:
    def __init__(
        self,
        engine: Engine,
        track: SpeechTrack,
        voice: VoiceInfo,
        emit: Emit,
        max_pending: int,
        spawn: Callable[..., asyncio.Task[None]],
        on_outcome: Callable[[str], None] | None = None,
        on_first_frame: Callable[[QueuedUtterance], None] | None = None,
    ) -> None:
        self.engine = engine
        self.track = track
        self.voice = voice
        self._emit = emit
        self.max_pending = max_pending
        self._spawn = spawn
        self._on_outcome = on_outcome
        self._on_first_frame_sent = on_first_frame
        self._pending: deque[QueuedUtterance] = deque()
        """Accepted and not finished, in playback order (the first may be playing)."""
        self._to_pump: deque[QueuedUtterance] = deque()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- requests -----------------------------------------------------------------------------------

    def submit(self, request: SpeakRequest, reply_to: object | None = None) -> QueuedUtterance:
        """Check and admit one utterance, or raise EngineError (bad text or voice, overloaded, queue full)."""
        if self.closed:
            raise EngineError("the session is closed", code="session_closed")
        if len(self._pending) >= self.max_pending:
            raise QueueFull(self.max_pending)
        speech = SynthesisRequest(
            text=request.text,
            voice=self.voice.id if request.voice is None else request.voice,
            options=SynthesisOptions(speed=request.speed, seed=request.seed),
            normalize=request.normalize,
            text_type=request.input_type,
            lexicons=tuple(request.lexicons),
            sample_rate=SAMPLE_RATE,
            trim_leading_silence=True,  # the voice's silence before its first sound would only delay the player
            names=FieldNames(voice=request.voice_param),
            words=True,  # the DataChannel's word and mark events
        )
        # Checked now either way; opened now when nothing plays before it, else when its turn comes.
        stream = None if self._pending else self.engine.open_stream(speech)
        voice = self.engine.validate(speech) if stream is None else stream.voice.info
        speech = replace(speech, voice=voice.id)
        utterance = QueuedUtterance(request.request_id or f"u{next(_ids)}", speech, voice, stream, reply_to)
        self._pending.append(utterance)
        self._to_pump.append(utterance)
        self.track.activate()
        if self._task is None or self._task.done():
            self._task = self._spawn(self._run(), "whep-playback")
        return utterance

    def queue_position(self, utterance: QueuedUtterance) -> int:
        """0 for the utterance playing (or next to), 1 for the one after it, and so on."""
        return list(self._pending).index(utterance) if utterance in self._pending else 0

    def cancel(self) -> list[QueuedUtterance]:
        """Barge-in: stop the utterance playing and drop the queued ones; returns them."""
        cancelled = self._stop_all()
        self.track.expecting = False
        for utterance in cancelled:
            played = self.track.speech_frames_sent - utterance.start_frame if utterance.first_frame_at else 0
            reached = delivered(utterance.words_played, max(0, played) * FRAME_S)
            self._send(
                utterance, "cancelled", audio_s=round(max(0, played) * FRAME_S, 3), last_word=reached["last_word"]
            )
            self._outcome("cancelled")
        return cancelled

    def close(self) -> None:
        """Free everything: streams cancelled, task stopped, nothing more is sent."""
        self.closed = True
        for _ in self._stop_all():
            self._outcome("cancelled")

    def _stop_all(self) -> list[QueuedUtterance]:
        """Cancel every utterance's stream, stop the playback task and silence the track; returns them."""
        stopped = list(self._pending)
        self._pending.clear()
        self._to_pump.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.track.clear()
        for utterance in stopped:
            if utterance.stream is not None:
                utterance.stream.cancel()
            utterance.state = "cancelled"
        return stopped

    # -- playback -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while self._to_pump:
            utterance = self._to_pump.popleft()
            await self._pump(utterance)

    async def _pump(self, utterance: QueuedUtterance) -> None:
        """Cut the stream's audio into 20 ms frames and queue them on the track, a little ahead of playback."""
        if utterance.stream is None:
            try:
                utterance.stream = self.engine.open_stream(utterance.request)
            except EngineError as error:
                utterance.state = "failed"
                self._send(utterance, "error", **error_fields(error))
                self._outcome("failed")
                self.track.mark(functools.partial(self._on_last_frame, utterance))
                return
        framer = FrameBuffer(FRAME_SAMPLES)
        started = False
        words: deque[WordTiming | MarkTiming] = deque()  # words and marks whose frame is not on the track yet
        try:
            async for event in utterance.stream.events():
                if isinstance(event, (WordTiming, MarkTiming)):
                    words.append(event)
                if not isinstance(event, AudioChunk):
                    continue
                for frame in framer.push(event.pcm):
                    if not started:
                        started = True
                        self.track.mark(functools.partial(self._on_first_frame, utterance))
                    self._mark_words(utterance, words, before_frame=utterance.frames)
                    self.track.push(frame)
                    utterance.frames += 1
                    self.track.expecting = True
                await self.track.wait_for_space(MAX_QUEUED_AUDIO_S)
            tail = framer.flush()
            if tail is not None:
                if not started:
                    self.track.mark(functools.partial(self._on_first_frame, utterance))
                self._mark_words(utterance, words, before_frame=utterance.frames)
                self.track.push(tail)
                utterance.frames += 1
            self._mark_words(utterance, words, before_frame=None)
        except StreamFailed as error:
            utterance.state = "failed"
            self._send(utterance, "error", **error_fields(error))
            self._outcome("failed")
        finally:
            self.track.expecting = False
        self.track.mark(functools.partial(self._on_last_frame, utterance))

    def _mark_words(
        self, utterance: QueuedUtterance, words: deque[WordTiming | MarkTiming], before_frame: int | None
    ) -> None:
        """Track marks for the words (and SSML marks) that start in the frame about to be queued (all of them when
        None)."""
        while words and (before_frame is None or int(words[0].start_s / FRAME_S) <= before_frame):
            self.track.mark(functools.partial(self._on_word, utterance, words.popleft()))

    def _on_word(self, utterance: QueuedUtterance, word: WordTiming | MarkTiming) -> None:
        if utterance.state not in ("queued", "speaking"):
            return
        if isinstance(word, MarkTiming):
            self._send(utterance, "mark", **mark_fields(word))
            return
        utterance.words_played.append(word)
        self._send(utterance, "word", **word_fields(word))

    def _on_first_frame(self, utterance: QueuedUtterance) -> None:
        if utterance.state != "queued":
            return
        utterance.state = "speaking"
        utterance.first_frame_at = time.monotonic()
        utterance.start_frame = self.track.speech_frames_sent
        self._send(
            utterance, "audio_start", ttfa_ms=round((utterance.first_frame_at - utterance.accepted_at) * 1000, 1)
        )
        if self._on_first_frame_sent is not None:
            self._on_first_frame_sent(utterance)

    def _on_last_frame(self, utterance: QueuedUtterance) -> None:
        if utterance in self._pending:
            self._pending.remove(utterance)
        if utterance.state in ("queued", "speaking"):
            utterance.state = "done"
            # ``ignored`` (left out when empty): what the utterance's markup asked for that was not done.
            ignored = utterance.stream.ignored if utterance.stream is not None else []
            self._send(utterance, "done", audio_s=round(utterance.frames * FRAME_S, 3), ignored=ignored or None)
            self._outcome("done")

    def _send(self, utterance: QueuedUtterance, kind: str, **fields: object) -> None:
        if not self.closed:
            self._emit(event(kind, request_id=utterance.id, **fields), utterance.reply_to)

    def _outcome(self, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)
