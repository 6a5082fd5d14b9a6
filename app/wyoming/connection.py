"""One Wyoming connection: what each event does, and the answers, in order.

The reader (``run``) takes events as they come, so a ``describe`` is answered at once, even while a request on
the same connection speaks, and a client that leaves is noticed at once: its streams are cancelled then. Requests
(``synthesize``, ``synthesize-start``) queue in the order they came, at most ``MAX_PENDING`` at once, and one sender
task answers them in turn (``Synthesis.send``), so a connection may carry several requests one after another.

- ``describe``: ``info`` (``info.py``), or ``error`` ``not_ready`` while the voices load.
- ``synthesize``: a request with its whole text; inside a streaming session it is ignored, since Home Assistant
  sends the session's whole text that way too, "for backwards compatibility", before its ``synthesize-stop``.
- ``synthesize-start`` / ``synthesize-chunk`` / ``synthesize-stop``: a streaming session (``synthesis.py``). A chunk
  or stop without a session, or a second start within one, gets ``error`` (``not_started``, ``stream_open``).
- Anything else (``select-program``, other domains' events) is ignored, as are fields this server does not use
  (``context``, ``text_format``: SSML is recognised by its ``<speak>``, as on every route).

Bytes that are not an event within the limits (``framing.py``) get ``error`` and the connection closes. While the
server drains, new requests get ``error`` ``server_shutting_down``; when the drain ends, a connection still
speaking gets that error too, and every connection closes. Wyoming has no authentication: API keys and quotas do
not apply here (the server listens on loopback unless ``RTVOICE_WYOMING_URI`` names another address).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from rtvoice.app.drain import Drain
from rtvoice.app.errors import ShuttingDown
from rtvoice.app.metrics import RequestMetrics
from rtvoice.app.request_context import begin, log_access, valid_or_new_id
from rtvoice.app.state import still_loading
from rtvoice.app.wyoming.framing import EventReader, EventWriter, FramingError, Gone, read_event
from rtvoice.app.wyoming.synthesis import NAMES, Kind, Synthesis
from rtvoice.app.wyoming.voice import requested_voice
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.request import SynthesisRequest

log = logging.getLogger(__name__)

MAX_PENDING = 8
"""Requests one connection may have speaking or waiting; past it a request gets ``error`` ``too_many_requests``."""


@dataclass(frozen=True)
class Services:
    """What every connection of one server uses."""

    engine: Engine
    metrics: RequestMetrics
    drain: Drain
    max_block_bytes: int
    """The largest data or payload block a client may send (``RTVOICE_MAX_BODY_BYTES``)."""
    info: Callable[[], Event]
    """The ``info`` event, as the engine's voices are now."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, services: Services) -> None:
        self.services = services
        self.events = EventReader(reader, services.max_block_bytes)
        self.writer = EventWriter(writer)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        self.queue: deque[Synthesis] = deque()
        """Requests waiting for the sender, in order."""
        self.current: Synthesis | None = None
        """The request whose answer is going out."""
        self.session: Synthesis | None = None
        """The streaming session taking chunks (``synthesize-start`` came, ``synthesize-stop`` not yet)."""
        self._queued = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    @property
    def engine(self) -> Engine:
        return self.services.engine

    async def run(self) -> None:
        """Read events until the client leaves or its bytes are not events; then free everything it had."""
        self._sender = asyncio.create_task(self._send_all(), name=f"wyoming-sender {self.peer}")
        try:
            await self._receive_all()
        finally:
            await self._release()

    async def _receive_all(self) -> None:
        while True:
            try:
                event = await read_event(self.events)
            except FramingError as error:
                log.warning("Wyoming client %s sent what is not an event (%s): closing", self.peer, error.message)
                await self._stop_sending()
                await self._say_error(error)
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # left in the middle of an event
            if event is None:
                return
            await self._handle(event)

    async def _handle(self, event: Event) -> None:
        kind, data = event.type, event.data
        if Describe.is_type(kind):
            await self._describe()
        elif Synthesize.is_type(kind):
            if self.session is None:  # inside a session: Home Assistant's copy of the whole text, not spoken twice
                self._synthesize(data)
        elif SynthesizeStart.is_type(kind):
            await self._start(data)
        elif SynthesizeChunk.is_type(kind):
            await self._chunk(data)
        elif SynthesizeStop.is_type(kind):
            await self._stop()
        # anything else is not for a TTS server: ignored

    # -- events ----------------------------------------------------------------------------------------

    async def _describe(self) -> None:
        if not self.engine.ready:
            await self._say_error(still_loading())
            self.services.metrics.count("wyoming", "describe", "not_ready")
            return
        await self._say(self.services.info())
        self.services.metrics.count("wyoming", "describe", "ok")

    def _synthesize(self, data: dict[str, Any]) -> None:
        synthesis = self._new("synthesize")
        if synthesis.error is not None:
            return
        try:
            text = data.get("text")
            if not isinstance(text, str):
                raise InvalidRequest("'text' must be a string", code="invalid_value", param="text")
            voice = requested_voice(data.get("voice"), self.engine.voice_infos(), self.engine.default_voice_id)
        except EngineError as error:
            synthesis.fail(error)
            return
        synthesis.open(self.engine, SynthesisRequest(text=text, voice=voice, names=NAMES))

    async def _start(self, data: dict[str, Any]) -> None:
        if self.session is not None:
            await self._say_error(
                InvalidRequest(
                    "a streaming synthesis is already open on this connection: send synthesize-stop first",
                    code="stream_open",
                )
            )
            return
        synthesis = self._new("synthesize-start")
        self.session = synthesis  # even when it failed: its chunks are dropped, its stop ends it
        if synthesis.error is not None:
            return
        try:
            voice = requested_voice(data.get("voice"), self.engine.voice_infos(), self.engine.default_voice_id)
        except EngineError as error:
            synthesis.fail(error)
            return
        synthesis.open(self.engine, SynthesisRequest(voice=voice, names=NAMES))

    async def _chunk(self, data: dict[str, Any]) -> None:
        session = self.session
        if session is None:
            await self._say_error(self._not_started("synthesize-chunk"))
            return
        text = data.get("text")
        if not isinstance(text, str):
            session.fail(InvalidRequest("'text' must be a string", code="invalid_value", param="text"))
            return
        session.push(self.engine, text)

    async def _stop(self) -> None:
        session = self.session
        if session is None:
            await self._say_error(self._not_started("synthesize-stop"))
            return
        self.session = None
        session.close_input()

    @staticmethod
    def _not_started(kind: str) -> InvalidRequest:
        return InvalidRequest(f"{kind} without a streaming synthesis: send synthesize-start first", code="not_started")

    def _new(self, kind: Kind) -> Synthesis:
        """A request, queued for the sender; failed already while the server drains or loads, or when the
        connection has too many."""
        synthesis = Synthesis(kind, begin(valid_or_new_id(None)))
        if self.services.drain.draining:
            synthesis.fail(ShuttingDown())
        elif not self.engine.ready:
            synthesis.fail(still_loading())
        elif len(self.live()) >= MAX_PENDING:
            synthesis.fail(
                InvalidRequest(
                    f"this connection has {MAX_PENDING} requests speaking or waiting; wait for their answers",
                    code="too_many_requests",
                )
            )
        self.queue.append(synthesis)
        self._queued.set()
        return synthesis

    # -- answers -----------------------------------------------------------------------------------------

    async def _say(self, event: Event) -> None:
        with contextlib.suppress(Gone):
            await self.writer.write(event)

    async def _say_error(self, error: EngineError | FramingError) -> None:
        await self._say(Error(text=error.message, code=error.code).event())

    async def _send_all(self) -> None:
        """The requests' answers, one after another, until the client is gone."""
        while True:
            while not self.queue:
                self._queued.clear()
                await self._queued.wait()
            synthesis = self.current = self.queue.popleft()
            try:
                await synthesis.send(self.writer)
            except Gone:
                synthesis.drop()
                return
            finally:
                self._finish(synthesis)
                self.current = None

    def _finish(self, synthesis: Synthesis) -> None:
        """Count the request and write its access line, once."""
        if not synthesis.in_progress:
            return
        synthesis.ended()
        status = synthesis.status()
        metrics = self.services.metrics
        metrics.count("wyoming", synthesis.kind, status)
        metrics.streams_ended("wyoming", synthesis.record.streams)
        log_access(self.peer, f"Wyoming {synthesis.kind}", status, synthesis.kind, synthesis.record)

    def live(self) -> list[Synthesis]:
        """Requests speaking, waiting, or taking chunks."""
        live = [] if self.current is None else [self.current]
        live += [synthesis for synthesis in self.queue if synthesis is not self.current]
        if self.session is not None and self.session not in live:
            live.append(self.session)
        return live

    def speaking(self) -> bool:
        """A request is speaking, waiting, or taking chunks (a drain waits for it)."""
        return bool(self.live())

    async def _stop_sending(self) -> None:
        """Drop every request (their streams cancelled now) and stop the sender where it is."""
        dropped = self.live()
        for synthesis in dropped:
            synthesis.drop()
        self.session = None
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for synthesis in dropped:
            self._finish(synthesis)
        self.queue.clear()
        self.current = None

    async def _release(self) -> None:
        """The client left, or the connection is over: free its work at once, then close."""
        await self._stop_sending()
        await self.writer.close()

    async def shut_down(self) -> None:
        """The server's drain ran out: a connection still speaking gets ``server_shutting_down``; then it closes."""
        speaking = self.speaking()
        await self._stop_sending()
        if speaking:
            await self._say_error(ShuttingDown())
        await self.writer.close()
