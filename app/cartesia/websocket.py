"""Cartesia's TTS WebSocket, ``/tts/websocket``, built around Cartesia's contexts. Each context is one engine stream:

* its first generation request fixes the voice, the output format (``raw`` ``pcm_s16le`` or ``pcm_f32le`` at
  ``sample_rate``) and the speed; later requests on it add text (``transcript``, pushed to the stream as it
  arrives: sentence ends start synthesis at once);
* ``max_buffer_delay_ms`` (default 3000, as Cartesia's) bounds how long text without a sentence end waits
  before it is spoken; ``0`` speaks each transcript as it comes (the client buffers);
* ``flush: true`` speaks what is buffered now, and ``flush_done`` (with its ``flush_id``) follows the audio
  of everything sent before it;
* ``continue: false`` ends the context's input; ``done`` follows its last ``chunk``, and the id may then be
  used again for a new context;
* ``{"context_id": ..., "cancel": true}`` stops the context at once: nothing more is sent for it.

Contexts on one socket run side by side (each has a sender task) and their chunks interleave, as Cartesia's
do. The messages sent, word timestamps among them, are ``messages.py``'s.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import ValidationError

from rtvoice.app.cartesia.messages import (
    chunk_message,
    client_token,
    done_message,
    error_message,
    flush_done_message,
    timestamps_message,
)
from rtvoice.app.cartesia.requests import GenerationRequest, cartesia_encoder, synthesis_request
from rtvoice.app.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, INTERNAL_ERROR, SHUTTING_DOWN
from rtvoice.app.errors import ShuttingDown, invalid_value
from rtvoice.app.request_context import track_stream
from rtvoice.app.websocket.io import Gone, SocketWriter, json_of, receive_loop, serve_session
from rtvoice.engine.audio.encoding import Encoder
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.stream import AudioChunk, MarkTiming, SegmentDone, SpeechStream, StreamState, WordTiming

log = logging.getLogger(__name__)

router = APIRouter(tags=["Cartesia"])

WEBSOCKET_PATH = "/tts/websocket"
DEFAULT_BUFFER_DELAY_MS = 3000
"""Cartesia's default ``max_buffer_delay_ms``."""


@dataclass(eq=False)
class Context:
    id: str
    stream: SpeechStream
    encoder: Encoder
    add_timestamps: bool
    buffer_delay_s: float
    """How long text without a sentence end may wait before it is spoken (0: never)."""
    transcripts_at: list[int] = field(default_factory=list)
    """Where each transcript starts in all the text the context was sent (its stream's ``text``, where its words'
    spans point)."""
    input_closed: bool = False
    cancelled: bool = False
    segments_sent: int = 0
    """Segments whose audio has all been sent."""
    flush_boundaries: list[int] = field(default_factory=list)
    """For each flush, in order, the number of segments its text made: flush k is done once they are sent."""
    flushes_done: int = 0
    buffer_timer: asyncio.TimerHandle | None = None
    sender: asyncio.Task[None] | None = None

    def flush_id_of(self, segment: int) -> int:
        """Cartesia numbers a context's transcripts between flushes from 1."""
        return 1 + bisect.bisect_right(self.flush_boundaries, segment)


class Connection:
    def __init__(self, websocket: WebSocket, engine: Engine) -> None:
        self.engine = engine
        self.writer = SocketWriter(websocket)
        self.ws = websocket
        self.contexts: dict[str, Context] = {}

    async def run(self) -> None:
        # ``_handle`` answers engine errors itself: an error ends the context it names, not the connection.
        await receive_loop(self.ws, self._handle, self._release)

    async def _release(self) -> None:
        """The client left (or the server closed the socket): free every context's work at once."""
        for context in list(self.contexts.values()):
            self._cancel(context)

    def speaking(self) -> bool:
        return bool(self.contexts)

    def owes_audio(self) -> bool:
        """A context whose input the client closed is still being spoken."""
        return any(context.input_closed and not context.cancelled for context in self.contexts.values())

    async def shut_down(self) -> None:
        for context in list(self.contexts.values()):
            self._cancel(context)
        await self.send_error(ShuttingDown(), None)
        await self.writer.close(CLOSE_GOING_AWAY, SHUTTING_DOWN)

    # -- receiving ---------------------------------------------------------------------------------

    async def _handle(self, message: dict[str, Any]) -> None:
        context_id: str | None = None
        try:
            body = json_of(message)
            if not isinstance(body, dict):
                raise InvalidRequest("a message is a JSON object", code="invalid_message")
            if isinstance(body.get("context_id"), str) and body["context_id"]:
                context_id = body["context_id"]
            if body.get("cancel") is True:
                self._on_cancel(context_id)
                return
            try:
                request = GenerationRequest.model_validate(body)
            except ValidationError as error:
                raise invalid_value(error) from error
            # Without a context id, each request is a generation of its own.
            context_id = context_id or str(uuid.uuid4())
            await self._on_generation(context_id, request)
        except EngineError as error:
            # Cartesia's errors are ``done: true``: the context they name ends with them.
            context = self.contexts.get(context_id or "")
            if context is not None:
                self._cancel(context)
            await self.send_error(error, context_id)

    def _on_cancel(self, context_id: str | None) -> None:
        context = self.contexts.get(context_id or "")
        if context is not None:  # an unknown or finished context: nothing to stop
            self._cancel(context)

    async def _on_generation(self, context_id: str, request: GenerationRequest) -> None:
        context = self.contexts.get(context_id)
        if context is None:
            context = self._open(context_id, request)
        elif context.input_closed:
            raise InvalidRequest(
                f"context {context_id!r} has ended its input ('continue': false) and is still "
                "speaking; send new text on a new context",
                code="context_closed",
                param="context_id",
            )
        if request.transcript:
            self._add_text(context, request.transcript)
        if request.flush:
            context.stream.flush()
            context.flush_boundaries.append(len(context.stream.segments))
            await self.send_due_flushes(context)  # at once when its audio is already out
        if not request.continue_:
            self._cancel_buffer_timer(context)
            context.stream.close_input()
            context.input_closed = True

    def _open(self, context_id: str, request: GenerationRequest) -> Context:
        speech = synthesis_request(request, None, words=request.add_timestamps)
        encoder = cartesia_encoder(request.output_format, ("raw",))
        stream = self.engine.open_stream(speech)
        track_stream(stream)
        delay_ms = DEFAULT_BUFFER_DELAY_MS if request.max_buffer_delay_ms is None else request.max_buffer_delay_ms
        context = Context(context_id, stream, encoder(stream.sample_rate), request.add_timestamps, delay_ms / 1000)
        self.contexts[context_id] = context
        context.sender = asyncio.create_task(ContextSender(self, context).run(), name="rtvoice-cartesia-sender")
        return context

    def _add_text(self, context: Context, text: str) -> None:
        segments_before, starts_at = len(context.stream.segments), len(context.stream.text)
        context.stream.push_text(text)
        context.transcripts_at.append(starts_at)
        if context.buffer_delay_s == 0:
            context.stream.flush()  # custom buffering: the client sends what it wants spoken now
            return
        # Managed buffering: text past the last sentence end waits at most the delay, counted from when it
        # began to wait (the push that completed a sentence restarts the count for what follows it).
        if len(context.stream.segments) > segments_before:
            self._cancel_buffer_timer(context)
        if context.buffer_timer is None:
            context.buffer_timer = asyncio.get_running_loop().call_later(
                context.buffer_delay_s, self._buffer_expired, context
            )

    def _buffer_expired(self, context: Context) -> None:
        context.buffer_timer = None
        if not (context.input_closed or context.cancelled):
            context.stream.flush()

    @staticmethod
    def _cancel_buffer_timer(context: Context) -> None:
        if context.buffer_timer is not None:
            context.buffer_timer.cancel()
            context.buffer_timer = None

    def _cancel(self, context: Context) -> None:
        context.cancelled = True
        self._cancel_buffer_timer(context)
        context.stream.cancel()
        if context.sender is not None and context.sender is not asyncio.current_task():
            context.sender.cancel()  # at most the message already on its way still leaves
        self.forget(context)

    def forget(self, context: Context) -> None:
        if self.contexts.get(context.id) is context:
            del self.contexts[context.id]

    # -- sending -----------------------------------------------------------------------------------

    async def send_due_flushes(self, context: Context) -> None:
        """``flush_done`` for every flush whose text's audio has all been sent, in order."""
        try:
            while (
                context.flushes_done < len(context.flush_boundaries)
                and context.flush_boundaries[context.flushes_done] <= context.segments_sent
            ):
                context.flushes_done += 1
                await self.writer.send_json(flush_done_message(context.id, context.flushes_done))
        except Gone:
            pass  # the receive loop sees the disconnect

    async def send_error(self, error: EngineError, context_id: str | None) -> None:
        try:
            await self.writer.send_json(error_message(error, context_id))
        except Gone:
            pass


class ContextSender:
    """Sends one context's audio as ``chunk`` messages, its words as ``timestamps``, its ``flush_done``s, and its
    ``done``."""

    def __init__(self, connection: Connection, context: Context) -> None:
        self.connection = connection
        self.context = context
        self.writer = connection.writer
        self.words: list[tuple[str, float, float]] = []
        """Words to send with the next chunk: token, start, end."""
        self.marks: list[MarkTiming] = []
        """SSML marks to send with the next chunk."""
        self.token_end = 0
        """Where the last word's token ends in the transcript."""

    async def run(self) -> None:
        context = self.context
        try:
            try:
                async for event in context.stream.events():
                    if context.cancelled:
                        return
                    await self.on_event(event)
            except EngineError as error:  # StreamFailed: this context is lost, the connection is not
                self.connection.forget(context)
                await self.connection.send_error(error, context.id)
                return
            if context.cancelled:
                return
            if context.stream.state is StreamState.CANCELLED:  # not by the client: the server is stopping
                self.connection.forget(context)
                await self.connection.send_error(ShuttingDown(), context.id)
                await self.writer.close(CLOSE_GOING_AWAY, SHUTTING_DOWN)
                return
            await self.send_words()
            context.segments_sent = len(context.stream.segments)
            await self.connection.send_due_flushes(context)
            self.connection.forget(context)  # the id is free for a new context from here on
            await self.writer.send_json(done_message(context.id, context.stream.ignored))
        except Gone:
            context.stream.cancel()
        except Exception:
            log.exception("cartesia context sender failed")
            context.stream.cancel()
            await self.writer.close(CLOSE_INTERNAL_ERROR, INTERNAL_ERROR)

    async def on_event(self, event: object) -> None:
        """One stream event as Cartesia's messages: words and marks (when the context asked for
        ``add_timestamps``) wait for the chunk that holds their starts and go in one ``timestamps`` message just
        before it."""
        context = self.context
        if isinstance(event, WordTiming):
            if context.add_timestamps:
                token, self.token_end = client_token(context.stream.text, context.transcripts_at, event, self.token_end)
                self.words.append((token, event.start_s, event.end_s))
        elif isinstance(event, MarkTiming):
            if context.add_timestamps:
                self.marks.append(event)
        elif isinstance(event, AudioChunk):
            data = context.encoder.encode(event.pcm)
            if data:
                await self.send_words()
                await self.writer.send_json(chunk_message(context.id, data, context.flush_id_of(event.segment)))
        elif isinstance(event, SegmentDone):
            context.segments_sent = event.index + 1
            await self.connection.send_due_flushes(context)

    async def send_words(self) -> None:
        if self.words or self.marks:
            tokens, starts, ends = zip(*self.words, strict=True) if self.words else ((), (), ())
            marks, self.words, self.marks = self.marks, [], []
            await self.writer.send_json(timestamps_message(self.context.id, tokens, starts, ends, marks))


@router.websocket(WEBSOCKET_PATH)
async def tts_websocket(websocket: WebSocket) -> None:
    """Cartesia's TTS WebSocket: contexts, continuations, flush, cancel; see the module docstring."""
    await serve_session(websocket, WEBSOCKET_PATH, lambda error: error_message(error, None), Connection)
