"""WebSocket ``/v1/tts/stream``: text in as it is written (an LLM's tokens), PCM out as soon as a sentence ends.

The protocol (README, "WebSocket protocol", has examples):

* client -> server, JSON text frames: ``start`` (voice, sample_rate, encoding, speed, seed), ``text`` (a
  fragment of any size), ``flush`` (end the current utterance: speak its remainder), ``cancel`` (barge-in:
  stop every utterance now, drop buffered text), ``end`` (speak everything, then ``done`` and close 1000).
* server -> client: binary frames of int16 little-endian mono PCM at the session's rate, and JSON events:
  ``started``, ``audio_start``, ``segment_done``, ``done``, ``cancelled``, ``error``.

An utterance is one engine stream. It opens with the first text after ``start`` or after the previous
utterance's ``flush``; sentence ends in its text start synthesis at once (the stream's segmenter works on
fragments); ``flush`` closes its input, and its ``done`` follows its last audio. Utterances are spoken in
order: one opened while another still speaks synthesises in parallel and is sent after it.

Two tasks per connection: this handler reads control messages, a sender task writes the current utterance's
audio and events, so a ``cancel`` is read (and acted on) while audio streams. Sends share one lock so frames
never interleave; a cancel stops the sender task itself, so at most the frame already on its way follows it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtvoice.app.errors import error_fields, invalid_value
from rtvoice.app.request_context import track_stream
from rtvoice.app.websocket_io import (CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, CLOSE_NORMAL, Gone, SocketWriter, json_of,
                                      received, serve_session)
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions, Voice
from rtvoice.engine.stream import AudioChunk, SegmentDone, SpeechStream, StreamState
from rtvoice.engine.text import is_speakable

log = logging.getLogger(__name__)

router = APIRouter(tags=["WebSocket"])

PATH = "/v1/tts/stream"
ENCODINGS = ("pcm_s16le",)
MESSAGE_TYPES = ("start", "text", "flush", "cancel", "end")



class StartMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    voice: str | None = Field(None, description="A voice id from /voices (or an alias); the default when omitted.")
    sample_rate: int | None = Field(None, description="Output rate; the voice's own rate when omitted.")
    encoding: str = Field("pcm_s16le", description="Binary frames' format: int16 little-endian mono PCM.")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    seed: int | None = Field(None, description="Makes each utterance's random draws reproducible.")


@dataclass(frozen=True)
class SessionConfig:
    voice: Voice
    sample_rate: int
    options: SynthesisOptions


@dataclass(eq=False)
class Utterance:
    index: int
    stream: SpeechStream
    text: str = ""
    text_at: float | None = None
    """When the text that completed its first segment (or its flush) arrived: where TTFA starts."""
    ttfa_s: float | None = None
    samples: int = 0
    dropped: bool = False
    """Removed without a ``done`` (cancelled, or flushed with nothing to speak)."""

    def mark_text(self) -> None:
        if self.text_at is None and self.stream.segments:
            self.text_at = time.monotonic()


class _End:
    """Queued after the last utterance when the client sent ``end``."""


_END = _End()


class Connection:
    def __init__(self, websocket: WebSocket, engine: Engine) -> None:
        self.ws = websocket
        self.engine = engine
        self.config: SessionConfig | None = None
        self.open: Utterance | None = None
        """The utterance taking text (no flush yet)."""
        self.current: Utterance | None = None
        """The utterance whose audio the sender is sending."""
        self.queue: deque[Utterance | _End] = deque()
        """Utterances waiting for the sender, in order; ``_END`` last once the client sent ``end``."""
        self.queued = asyncio.Event()
        self.ending = False
        self.writer = SocketWriter(websocket)
        self.next_index = 0
        self.total_audio_s = 0.0
        self.utterances_done = 0
        self.previous_end = 0.0
        """When the sender finished the previous utterance (monotonic)."""
        self._sender: asyncio.Task[None] | None = None

    # -- the two tasks ----------------------------------------------------------------------------------

    async def run(self) -> None:
        self._sender = asyncio.create_task(self._send_loop(), name="rtvoice-ws-sender")
        try:
            async for message in received(self.ws):
                try:
                    await self._handle(message)
                except EngineError as error:
                    await self._send_error(error)
                except Gone:
                    return  # the socket closed under a reply
        finally:
            # The client left (or the server closed the socket): free its work at once.
            self._drop_all()
            await self._stop_sender()

    async def _send_loop(self) -> None:
        try:
            while True:
                while not self.queue:
                    self.queued.clear()
                    await self.queued.wait()
                item = self.queue.popleft()
                if isinstance(item, _End):
                    await self._finish(None)
                    return
                self.current = item
                try:
                    ok = await self._speak(item)
                finally:
                    self.current = None
                    self.previous_end = time.monotonic()
                if ok:
                    final = bool(self.queue) and isinstance(self.queue[0], _End)
                    await self._finish(item, final)
                    if final:
                        return
        except Gone:
            self._drop_all()
        except Exception:
            log.exception("websocket sender failed")
            self._drop_all()
            await self._close(CLOSE_INTERNAL_ERROR, "internal error")

    async def _stop_sender(self) -> None:
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()
            await asyncio.wait([self._sender])

    # -- sending ---------------------------------------------------------------------------------------

    async def _send(self, text: str | None = None, data: bytes | None = None) -> None:
        await self.writer.send(text, data)

    async def _send_event(self, payload: dict[str, Any]) -> None:
        await self.writer.send_json(payload)

    async def _send_error(self, error: EngineError, **extra: Any) -> None:
        payload = {"type": "error", **error_fields(error), **extra}
        try:
            await self._send_event(payload)
        except Gone:
            pass  # the receive loop sees the disconnect next

    async def _close(self, code: int, reason: str = "") -> None:
        await self.writer.close(code, reason)

    async def _speak(self, utterance: Utterance) -> bool:
        """Send one utterance's audio and segment ends; False when it ended without a ``done``."""
        stream = utterance.stream
        try:
            async for event in stream.events():
                if utterance.dropped:
                    return False
                if isinstance(event, AudioChunk):
                    if utterance.ttfa_s is None:
                        # From the text that made its first segment (or its flush), or from the end of the
                        # utterance it waited behind, whichever is later.
                        now = time.monotonic()
                        utterance.ttfa_s = now - max(utterance.text_at or now, self.previous_end)
                        await self._send_event({
                            "type": "audio_start", "utterance": utterance.index, "sample_rate": stream.sample_rate,
                            "encoding": "pcm_s16le", "ttfa_ms": round(utterance.ttfa_s * 1000, 1),
                        })
                    await self._send(data=event.pcm.astype("<i2", copy=False).tobytes())
                    utterance.samples += len(event.pcm)
                elif isinstance(event, SegmentDone):
                    await self._send_event({"type": "segment_done", "utterance": utterance.index,
                                            "index": event.index, "text": event.text})
        except EngineError as error:  # StreamFailed: this utterance is lost, the connection is not
            if self.open is utterance:
                self.open = None
            await self._send_error(error, utterance=utterance.index)
            return False
        if utterance.dropped:
            return False
        if stream.state is StreamState.CANCELLED:
            # Not by the client (that sets ``dropped``): the server is shutting down.
            await self._send_error(InvalidRequest("the server is shutting down", code="server_shutting_down"),
                                   utterance=utterance.index)
            await self._close(CLOSE_GOING_AWAY, "server shutting down")
            raise Gone
        return True

    async def _finish(self, utterance: Utterance | None, final: bool = True) -> None:
        """``done`` for an utterance (or for ``end`` with nothing left to speak); closes after the final one."""
        payload: dict[str, Any] = {"type": "done", "utterance": None, "final": final}
        if utterance is not None:
            stats = utterance.stream.stats()
            audio_s = utterance.samples / utterance.stream.sample_rate
            self.total_audio_s += audio_s
            self.utterances_done += 1
            payload.update({
                "utterance": utterance.index,
                "audio_s": round(audio_s, 4),
                "segments": stats.segments,
                "text_chars": len(utterance.text),
                "ttfa_ms": None if utterance.ttfa_s is None else round(utterance.ttfa_s * 1000, 1),
                "compute_s": round(stats.compute_s, 4),
                "late_chunks": stats.late_chunks,
            })
        else:
            payload.update({"audio_s": 0.0, "segments": 0, "text_chars": 0, "ttfa_ms": None})
        if final:
            payload["session"] = {"utterances": self.utterances_done, "audio_s": round(self.total_audio_s, 4)}
        await self._send_event(payload)
        if final:
            await self._close(CLOSE_NORMAL)

    # -- receiving -------------------------------------------------------------------------------------

    async def _handle(self, message: dict[str, Any]) -> None:
        body = json_of(message)
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            raise InvalidRequest("a message is a JSON object with a string 'type'", code="invalid_message",
                                 param="type")
        kind = body["type"]
        if kind == "start":
            await self._on_start(body)
        elif kind == "text":
            self._on_text(body)
        elif kind == "flush":
            self._on_flush()
        elif kind == "cancel":
            await self._on_cancel()
        elif kind == "end":
            self._on_end()
        else:
            raise InvalidRequest(f"unknown message type {kind!r}; valid types: {', '.join(MESSAGE_TYPES)}",
                                 code="unknown_type", param="type")

    def _check_open_for_input(self) -> None:
        if self.ending:
            raise InvalidRequest("the session has ended ('end' was sent); open a new connection", code="input_closed")

    async def _on_start(self, body: dict[str, Any]) -> None:
        self._check_open_for_input()
        try:
            start = StartMessage.model_validate(body)
        except ValidationError as error:
            raise invalid_value(error) from error
        if start.encoding not in ENCODINGS:
            raise InvalidRequest(f"unsupported encoding {start.encoding!r}; supported: {', '.join(ENCODINGS)}",
                                 code="unsupported_encoding", param="encoding")
        self.engine.check_sample_rate(start.sample_rate)
        voice = self.engine.resolve_voice(start.voice)
        options = SynthesisOptions(speed=start.speed, seed=start.seed)
        try:
            voice.validate(options)
        except ValueError as error:
            raise InvalidRequest(str(error), code="invalid_value", param="speed") from error
        self.config = SessionConfig(voice, start.sample_rate or voice.info.sample_rate, options)
        await self._send_event({"type": "started", "voice": voice.info.id, "sample_rate": self.config.sample_rate,
                                "encoding": "pcm_s16le", "speed": start.speed, "seed": start.seed})

    def _on_text(self, body: dict[str, Any]) -> None:
        self._check_open_for_input()
        if self.config is None:
            raise InvalidRequest("send 'start' before 'text'", code="not_started")
        fragment = body.get("text")
        if not isinstance(fragment, str):
            raise InvalidRequest("'text' must be a string", code="invalid_message", param="text")
        if not fragment:
            return
        limit = self.engine.settings.max_text_chars
        held = len(self.open.text) if self.open is not None else 0
        if held + len(fragment) > limit:
            raise InvalidRequest(f"the utterance would have {held + len(fragment)} characters; the limit is {limit} "
                                 "(this fragment was dropped; 'flush' to speak what came before it)",
                                 code="input_too_long", param="text")
        utterance = self.open or self._open_utterance()
        utterance.text += fragment
        utterance.stream.push_text(fragment)
        utterance.mark_text()

    def _open_utterance(self) -> Utterance:
        assert self.config is not None
        stream = self.engine.open_stream(self.config.voice, self.config.options, self.config.sample_rate)
        track_stream(stream)
        utterance = Utterance(self.next_index, stream)
        self.next_index += 1
        self.open = utterance
        self.queue.append(utterance)
        self.queued.set()
        return utterance

    def _on_flush(self) -> None:
        self._check_open_for_input()
        if self.config is None:
            raise InvalidRequest("send 'start' before 'flush'", code="not_started")
        utterance = self.open
        if utterance is None or not is_speakable(utterance.text):
            if utterance is not None:
                self._drop(utterance)
            raise InvalidRequest("nothing to speak: send text with letters or digits before 'flush'",
                                 code="empty_input")
        self._close_input(utterance)

    def _close_input(self, utterance: Utterance) -> None:
        utterance.stream.close_input()
        utterance.mark_text()
        if self.open is utterance:
            self.open = None

    async def _on_cancel(self) -> None:
        stopped = [u.index for u in self._live()]
        self._drop_all()
        # Stop the sender where it is (at most the frame already written goes out), then start a fresh one.
        await self._stop_sender()
        if self.writer.closed:
            return
        self._sender = asyncio.create_task(self._send_loop(), name="rtvoice-ws-sender")
        try:
            await self._send_event({"type": "cancelled", "utterances": stopped})
        except Gone:
            pass

    def _on_end(self) -> None:
        self._check_open_for_input()
        self.ending = True
        if self.open is not None:
            if is_speakable(self.open.text):
                self._close_input(self.open)
            else:
                self._drop(self.open)
        self.queue.append(_END)
        self.queued.set()

    def speaking(self) -> bool:
        """An utterance is being spoken, queued, or taking text."""
        return bool(self._live()) or self.open is not None

    async def shut_down(self) -> None:
        """The server's drain ran out: stop speaking, say ``server_shutting_down``, close 1001."""
        self._drop_all()
        await self._stop_sender()
        await self._send_error(InvalidRequest("the server is shutting down", code="server_shutting_down"))
        await self._close(CLOSE_GOING_AWAY, "server shutting down")

    # -- bookkeeping -----------------------------------------------------------------------------------

    def _live(self) -> list[Utterance]:
        live = [] if self.current is None else [self.current]
        live += [u for u in self.queue if isinstance(u, Utterance) and u is not self.current]
        return [u for u in live if not u.dropped]

    def _drop(self, utterance: Utterance) -> None:
        utterance.dropped = True
        utterance.stream.cancel()
        if self.open is utterance:
            self.open = None
        try:
            self.queue.remove(utterance)
        except ValueError:
            pass  # the sender has it; it sees ``dropped`` and stops

    def _drop_all(self) -> None:
        for utterance in self._live():
            self._drop(utterance)
        if self.open is not None:
            self._drop(self.open)


@router.websocket(PATH)
async def tts_stream(websocket: WebSocket) -> None:
    """Streaming text in, PCM out; see the module docstring and the README for the protocol."""
    await serve_session(websocket, PATH, lambda error: {"type": "error", **error_fields(error)}, Connection)
