"""Cartesia's TTS API: the WebSocket ``/tts/websocket`` and ``POST /tts/bytes``.

Clients written for Cartesia (Pipecat's ``CartesiaTTSService``, LiveKit's ``cartesia.TTS``) work with nothing
changed but the URL. ``api_key``/``X-API-Key`` and ``cartesia_version``/``Cartesia-Version`` are accepted and
not checked (rtvoice has no API keys); ``model_id``, ``language`` and the voice controls other than
``generation_config.speed`` are accepted and ignored. Extension: ``seed`` (reproducible output).

The WebSocket is built around Cartesia's contexts. Each context is one engine stream:

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
do. Every message the server sends carries its ``context_id``. An ``error`` is ``done: true``: the context it
names has ended, and its id may open a new one.

Word timestamps: with ``add_timestamps``, each context's words come as ``timestamps`` messages with
``word_timestamps`` (``words``, ``start``, ``end``: seconds from the start of the context's audio, cumulative across
its transcripts), sent just before the ``chunk`` that holds the words' starts: a client knows which words were
heard when it stops playback. A word is the client's own token, punctuation included (``"$100,"``), since
clients align the words with the text they sent (LiveKit finds each in its transcript, in order). CosyVoice2 voices'
times are estimates (rtvoice's other routes say ``approximate``; Cartesia's message has no place for it).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtvoice.app.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, INTERNAL_ERROR, SHUTTING_DOWN
from rtvoice.app.errors import ShuttingDown, http_status, invalid_value
from rtvoice.app.fields import Speed
from rtvoice.app.json_body import parse_json_body
from rtvoice.app.openapi import schema_ref
from rtvoice.app.request_context import track_stream
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body, stream_headers
from rtvoice.app.websocket.io import (
    Gone,
    SocketWriter,
    json_of,
    received,
    serve_session,
)
from rtvoice.engine.audio.encoding import Encoder, PcmEncoder, PcmF32Encoder, WavEncoder, create_encoder
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest, Overloaded
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import FieldNames, SynthesisRequest
from rtvoice.engine.stream import AudioChunk, SegmentDone, SpeechStream, StreamState, WordTiming

log = logging.getLogger(__name__)

router = APIRouter(tags=["Cartesia"])

WEBSOCKET_PATH = "/tts/websocket"
BYTES_PATH = "/tts/bytes"
STATUS_PARTIAL = 206
"""Cartesia's ``status_code`` on every message of a context in progress."""
STATUS_TOO_MANY = 429
"""Cartesia's ``status_code`` for a concurrency limit: rtvoice's ``overloaded``."""
DEFAULT_BUFFER_DELAY_MS = 3000
"""Cartesia's default ``max_buffer_delay_ms``."""
RAW_ENCODERS: dict[str, type[PcmEncoder] | type[PcmF32Encoder]] = {"pcm_s16le": PcmEncoder, "pcm_f32le": PcmF32Encoder}
CARTESIA_VOICE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
"""Cartesia's voice ids are UUIDs."""


# -- requests --------------------------------------------------------------------------------------


class VoiceSpecifier(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: Literal["id", "embedding"] = "id"
    id: str | None = Field(
        None,
        description="An rtvoice voice id or alias; a Cartesia voice id (a UUID) that "
        "names no rtvoice voice speaks with the default voice.",
    )


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    container: Literal["raw", "wav", "mp3"] = "raw"
    encoding: str = "pcm_s16le"
    sample_rate: int | None = Field(None, description="The voice's own rate when omitted.")


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speed: Speed | None = None


class SpeechRequest(BaseModel):
    """The fields /tts/bytes and a WebSocket generation request share."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model_id: str | None = Field(None, description="Accepted; the voice decides the model.")
    transcript: str = ""
    voice: VoiceSpecifier = Field(default_factory=VoiceSpecifier)
    output_format: OutputFormat = Field(default_factory=OutputFormat)
    language: str | None = Field(None, description="Accepted; the voice decides the language.")
    generation_config: GenerationConfig = Field(default_factory=GenerationConfig)
    seed: int | None = Field(None, description="rtvoice extension: makes the voice's random draws reproducible.")


class GenerationRequest(SpeechRequest):
    context_id: str | None = None
    continue_: bool = Field(False, alias="continue")
    flush: bool = False
    add_timestamps: bool = False
    max_buffer_delay_ms: int | None = Field(None, ge=0, le=5000)


NAMES = FieldNames(
    text="transcript", voice="voice.id", sample_rate="output_format.sample_rate", speed="generation_config.speed"
)
"""Cartesia's names for the request's fields."""


def synthesis_request(request: SpeechRequest, text: str | None) -> SynthesisRequest:
    """The engine request of a Cartesia request. Cartesia's own voice ids (UUIDs), which no rtvoice voice has,
    speak with the default voice, so a client switched from Cartesia keeps working; any other unknown name is an
    error."""
    if request.voice.mode != "id":
        raise InvalidRequest(
            "voice embeddings are not supported; give a voice by id (voice.mode 'id')",
            code="unsupported_voice_mode",
            param="voice.mode",
        )
    voice = request.voice.id
    return SynthesisRequest(
        text=text,
        voice=voice,
        options=SynthesisOptions(speed=request.generation_config.speed or 1.0, seed=request.seed),
        sample_rate=request.output_format.sample_rate,
        unknown_voice_is_default=bool(voice and CARTESIA_VOICE_ID.match(voice)),
        names=NAMES,
    )


def cartesia_encoder(fmt: OutputFormat, containers: Sequence[str]) -> Callable[[int], Encoder]:
    """How to encode ``fmt`` at a rate, once the format is known to be served (InvalidRequest otherwise)."""
    if fmt.container not in containers:
        raise InvalidRequest(
            f"container {fmt.container!r} is not served here; use {', '.join(containers)}",
            code="unsupported_format",
            param="output_format.container",
        )
    if fmt.container == "mp3":
        return lambda sample_rate: create_encoder("mp3", sample_rate)
    encodings = ["pcm_s16le"] if fmt.container == "wav" else list(RAW_ENCODERS)
    if fmt.encoding not in encodings:
        raise InvalidRequest(
            f"encoding {fmt.encoding!r} is not served in a {fmt.container} container; use {', '.join(encodings)}",
            code="unsupported_encoding",
            param="output_format.encoding",
        )
    if fmt.container == "wav":
        return WavEncoder
    raw = RAW_ENCODERS[fmt.encoding]
    return lambda sample_rate: raw()


# -- server messages -------------------------------------------------------------------------------


def chunk_message(context_id: str, data: bytes, flush_id: int) -> dict[str, Any]:
    return {
        "type": "chunk",
        "data": base64.b64encode(data).decode(),
        "done": False,
        "status_code": STATUS_PARTIAL,
        "flush_id": flush_id,
        "context_id": context_id,
    }


def flush_done_message(context_id: str, flush_id: int) -> dict[str, Any]:
    return {
        "type": "flush_done",
        "done": False,
        "flush_done": True,
        "flush_id": flush_id,
        "status_code": STATUS_PARTIAL,
        "context_id": context_id,
    }


def done_message(context_id: str) -> dict[str, Any]:
    return {"type": "done", "done": True, "status_code": STATUS_PARTIAL, "context_id": context_id}


def timestamps_message(
    context_id: str, words: Sequence[str], starts_s: Sequence[float], ends_s: Sequence[float]
) -> dict[str, Any]:
    """Word timings (seconds in the context's audio) as Cartesia's ``timestamps`` message: the one place where
    rtvoice's word timings become ``word_timestamps``."""
    return {
        "type": "timestamps",
        "done": False,
        "status_code": STATUS_PARTIAL,
        "context_id": context_id,
        "word_timestamps": {
            "words": list(words),
            "start": [round(s, 4) for s in starts_s],
            "end": [round(e, 4) for e in ends_s],
        },
    }


def client_token(
    transcript: str, transcripts_at: Sequence[int], word: WordTiming, previous_end: int
) -> tuple[str, int]:
    """The word as the blank-separated token of the client's text it belongs to: its span widened over the
    punctuation around it, not past a blank, the previous word's token or the transcript it came in (a client may
    send sentences with no blank between them). Returns the token and its end."""
    first_in = bisect.bisect_right(transcripts_at, word.start) - 1
    last_in = bisect.bisect_right(transcripts_at, word.end - 1) - 1  # a word may span transcripts (LLM tokens)
    first = max(previous_end, transcripts_at[first_in] if first_in >= 0 else 0)
    last = transcripts_at[last_in + 1] if last_in + 1 < len(transcripts_at) else len(transcript)
    start, end = word.start, word.end
    while start > first and not transcript[start - 1].isspace():
        start -= 1
    while end < last and not transcript[end].isspace():
        end += 1
    return transcript[start:end], end


def error_message(error: EngineError, context_id: str | None) -> dict[str, Any]:
    """Cartesia's WebSocket error event, from an engine error (its code, message and param are rtvoice's)."""
    payload: dict[str, Any] = {
        "type": "error",
        "done": True,
        "status_code": STATUS_TOO_MANY if isinstance(error, Overloaded) else http_status(error).status,
        "error_code": error.code,
        "title": error.code.replace("_", " ").capitalize(),
        "message": error.message,
        "param": error.param,
        "request_id": str(uuid.uuid4()),
        "context_id": context_id,
    }
    if error.retry_after_s is not None:
        payload["retry_after_s"] = error.retry_after_s
    return payload


# -- WebSocket -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Context:
    id: str
    stream: SpeechStream
    encoder: Encoder
    add_timestamps: bool
    buffer_delay_s: float
    """How long text without a sentence end may wait before it is spoken (0: never)."""
    transcript: str = ""
    """All the text the context was sent: where its words' spans point."""
    transcripts_at: list[int] = field(default_factory=list)
    """Where each transcript starts in ``transcript``."""
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
        try:
            async for message in received(self.ws):
                try:
                    await self._handle(message)
                except Gone:
                    return
        finally:
            # The client left (or the server closed the socket): free every context's work at once.
            for context in list(self.contexts.values()):
                self._cancel(context)

    def speaking(self) -> bool:
        return bool(self.contexts)

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
        speech = synthesis_request(request, None)
        encoder = cartesia_encoder(request.output_format, ("raw",))
        stream = self.engine.open_stream(speech)
        track_stream(stream)
        delay_ms = DEFAULT_BUFFER_DELAY_MS if request.max_buffer_delay_ms is None else request.max_buffer_delay_ms
        context = Context(context_id, stream, encoder(stream.sample_rate), request.add_timestamps, delay_ms / 1000)
        self.contexts[context_id] = context
        context.sender = asyncio.create_task(ContextSender(self, context).run(), name="rtvoice-cartesia-sender")
        return context

    def _add_text(self, context: Context, text: str) -> None:
        segments_before = len(context.stream.segments)
        context.stream.push_text(text)
        context.transcripts_at.append(len(context.transcript))
        context.transcript += text
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
            await self.writer.send_json(done_message(context.id))
        except Gone:
            context.stream.cancel()
        except Exception:
            log.exception("cartesia context sender failed")
            context.stream.cancel()
            await self.writer.close(CLOSE_INTERNAL_ERROR, INTERNAL_ERROR)

    async def on_event(self, event: object) -> None:
        """One stream event as Cartesia's messages: words (when the context asked for ``add_timestamps``) wait for
        the chunk that holds their starts and go in one ``timestamps`` message just before it."""
        context = self.context
        if isinstance(event, WordTiming):
            if context.add_timestamps:
                token, self.token_end = client_token(context.transcript, context.transcripts_at, event, self.token_end)
                self.words.append((token, event.start_s, event.end_s))
        elif isinstance(event, AudioChunk):
            data = context.encoder.encode(event.pcm)
            if data:
                await self.send_words()
                await self.writer.send_json(chunk_message(context.id, data, context.flush_id_of(event.segment)))
        elif isinstance(event, SegmentDone):
            context.segments_sent = event.index + 1
            await self.connection.send_due_flushes(context)

    async def send_words(self) -> None:
        if self.words:
            tokens, starts, ends = zip(*self.words, strict=True)
            self.words = []
            await self.writer.send_json(timestamps_message(self.context.id, tokens, starts, ends))


@router.websocket(WEBSOCKET_PATH)
async def tts_websocket(websocket: WebSocket) -> None:
    """Cartesia's TTS WebSocket: contexts, continuations, flush, cancel; see the module docstring."""
    await serve_session(websocket, WEBSOCKET_PATH, lambda error: error_message(error, None), Connection)


# -- bytes -----------------------------------------------------------------------------------------


@router.post(
    BYTES_PATH,
    response_class=StreamingResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema_ref(SpeechRequest, "CartesiaSpeechRequest")}},
        }
    },
    responses={200: {"content": {"audio/pcm": {}, "audio/wav": {}, "audio/mpeg": {}}}},
)
async def tts_bytes(request: Request) -> Response:
    """Cartesia's bytes endpoint: ``transcript`` spoken in ``output_format`` (raw, wav or mp3), streamed."""
    speech = await parse_json_body(request, SpeechRequest)
    encoder = cartesia_encoder(speech.output_format, ("raw", "wav", "mp3"))
    stream = engine_of(request).open_stream(synthesis_request(speech, speech.transcript))
    encoded = encoder(stream.sample_rate)
    return SpeechResponse(audio_body(stream, encoded), media_type=encoded.content_type, headers=stream_headers(stream))
