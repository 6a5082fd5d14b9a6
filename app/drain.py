"""Graceful drain on SIGTERM (``app/server.py`` starts it).

1. At once: ``/readyz`` answers 503 (``draining``) and every new request or WebSocket gets 503 with
   ``Retry-After`` and ``server_shutting_down`` (the probes still answer); a new Wyoming request, an ``error``
   event with that code.
2. Streams in progress (HTTP bodies, WebSocket utterances, WHEP utterances, Wyoming requests) finish, for up to
   ``RTVOICE_DRAIN_TIMEOUT_S``.
3. Then WebSockets get their protocol's ``server_shutting_down`` and close 1001, WHEP sessions end (an
   ``error`` event on their DataChannels first), and Wyoming connections close (those still speaking get the
   ``error`` first).
4. Then the server stops as usual (engine, lifespan) and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from rtvoice.app.errors import ShuttingDown, asgi_error
from rtvoice.app.limits import OpenSockets
from rtvoice.app.request_context import PROBE_PATHS

log = logging.getLogger(__name__)


class Drain:
    def __init__(self, timeout_s: float, sockets: OpenSockets) -> None:
        self.timeout_s = timeout_s
        self.sockets = sockets
        self.draining = False
        self.requests_in_flight = 0
        self.busy: list[Callable[[], bool]] = []
        """Each says whether some transport still has a stream in progress (engine streams, WHEP speakers)."""
        self.finishers: list[Callable[[], Awaitable[None]]] = []
        """Run after the WebSockets are closed (WHEP: end every session)."""

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("draining: new requests get 503; streams in progress have up to %g s to finish", self.timeout_s)

    def idle(self) -> bool:
        return self.requests_in_flight == 0 and not self.sockets.busy() and not any(check() for check in self.busy)

    async def run(self) -> None:
        """Wait for the streams in progress (up to the timeout), then close WebSockets and WHEP sessions."""
        self.begin()
        started = time.monotonic()
        deadline = started + self.timeout_s
        while not self.idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.idle():
            log.info("drained in %.1f s: every stream finished", time.monotonic() - started)
        else:
            log.warning("drain timeout (%g s): closing what is still in progress", self.timeout_s)
        await self.sockets.shut_down_all()
        for finish in self.finishers:
            try:
                await finish()
            except Exception:
                log.exception("drain step failed")


class DrainGate:
    """503 + Retry-After for new requests while draining; counts HTTP requests in flight."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope.get("method") != "DELETE":  # a DELETE only frees (a WHEP player leaving)
            await asgi_error(scope, send, ShuttingDown(), {"Connection": "close"} if scope["type"] == "http" else None)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)  # sockets are closed at the drain's end, not waited for
            return
        self.drain.requests_in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.requests_in_flight -= 1
