"""Running the app under uvicorn: limits on connections and request heads, and a drain on SIGTERM.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``), connections and requests at once
(``limit_concurrency``: ``RTVOICE_MAX_CONNECTIONS``) and WebSocket messages (``ws_max_size``:
``RTVOICE_WS_MAX_MESSAGE_BYTES``). With httptools it bounds neither how long a request's line and headers
may take nor how large they may grow, so a client sending its headers a byte at a time would hold its
connection (and memory) for ever. ``HeadLimitedHttpToolsProtocol`` adds both: the head must arrive within
``RTVOICE_HEADER_TIMEOUT_S`` (else 408 and close) and within ``RTVOICE_MAX_HEADER_BYTES`` (else 431 and close).
Bodies have their own deadline and size (``app/limits.py``).

``Server`` turns SIGTERM into a drain (``app/drain.py``) before uvicorn's own shutdown, and exits 0 after it;
SIGINT (Ctrl+C), or a second SIGTERM, stops at once as uvicorn does. It also stops the process, with exit
code 1, when the engine could not start (a corrupt voice or model directory).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rtvoice.app.drain import Drain
from rtvoice.app.settings import Settings

log = logging.getLogger(__name__)


def _plain_response(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeadLimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request's line and headers."""

    header_timeout_s = 10.0
    max_header_bytes = 16_384

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._awaiting_head = True

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's signature
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._awaiting_head and self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self.logger.warning("request head over %d bytes: 431 and close", self.max_header_bytes)
            self._refuse(b"431 Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head = True
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._awaiting_head = True
        self._head_bytes = 0

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self.logger.warning("request head not received within %g s: 408 and close", self.header_timeout_s)
            self._refuse(b"408 Request Timeout")

    def _refuse(self, status: bytes) -> None:
        self._disarm_head_timer()
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_plain_response(status))
        self.transport.close()


def protocol_class(settings: Settings) -> type[HeadLimitedHttpToolsProtocol]:
    """The protocol class with this server's limits (uvicorn makes one instance per connection)."""
    return type(
        "HttpProtocol",
        (HeadLimitedHttpToolsProtocol,),
        {"header_timeout_s": settings.header_timeout_s, "max_header_bytes": settings.max_header_bytes},
    )


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, start_failed: Callable[[], bool]) -> None:
        super().__init__(config)
        self.drain = drain
        self.start_failed = start_failed
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._draining is None and self._loop is not None and not self.should_exit:
            # Not recorded as captured: uvicorn re-raises captured signals at exit, and a drained server exits 0.
            # A fresh context: the signal may have interrupted a request, whose id must not follow the drain.
            self._loop.call_soon_threadsafe(self._start_drain, context=contextvars.Context())
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self._drain_then_exit(), name="rtvoice-drain")

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.start_failed():
            log.error("stopping: the engine could not start (see the error above)")
            self.exit_code = 1
            return True
        return await super().on_tick(counter)


def run(app: FastAPI, settings: Settings) -> int:
    """Serve ``app`` until it is stopped; the process's exit code."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,  # rtvoice.access writes the access lines (app/request_context.py)
        http=protocol_class(settings),
        limit_concurrency=settings.max_connections,
        ws_max_size=settings.ws_max_message_bytes,
        timeout_graceful_shutdown=5,
    )
    server = Server(config, app.state.drain, lambda: bool(getattr(app.state, "start_failed", False)))
    server.run()
    if server.exit_code == 0 and not server.started:
        return 1  # e.g. the port was taken
    return server.exit_code
