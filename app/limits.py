"""Limits on what a client may send, for every route, as ASGI middleware.

- ``BodyLimit``: a request body's size by its media type (JSON and plain forms ``RTVOICE_MAX_BODY_BYTES``,
  multipart ``RTVOICE_MAX_UPLOAD_BYTES``, WHEP offers ``RTVOICE_WHEP_MAX_SDP_BYTES``, trickle ICE
  ``RTVOICE_WHEP_MAX_TRICKLE_BYTES``): 413 from ``Content-Length`` before a byte is read, or as soon as a
  chunked body passes the limit. The whole body must arrive within ``RTVOICE_BODY_TIMEOUT_S`` of the request
  (408 otherwise), so a client trickling its body holds neither a worker nor memory for long. Once a limit
  is hit the route sees the client as gone and the middleware sends the answer.
- ``WebSocketLimits``: ``RTVOICE_WS_MAX_CONNECTIONS`` at once (503 with Retry-After before the upgrade) and an
  idle timeout: a socket with no message either way for ``RTVOICE_WS_IDLE_TIMEOUT_S`` is closed (1000,
  ``idle timeout``), unless the server still owes it audio it asked for. Message size is uvicorn's
  ``ws_max_size`` (close 1009), set from ``RTVOICE_WS_MAX_MESSAGE_BYTES`` in ``app/server.py``, with the header
  deadline and size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rtvoice.app.close_codes import CLOSE_GOING_AWAY, CLOSE_NORMAL, SHUTTING_DOWN
from rtvoice.app.errors import HttpError, asgi_error
from rtvoice.app.settings import Settings
from rtvoice.engine.errors import EngineError, Overloaded


class BodyTooLarge(HttpError):
    status = 413

    def __init__(self, limit: int, media_type: str) -> None:
        kind = f"{media_type} bodies" if media_type else "bodies of this type"
        super().__init__(f"the request body is larger than {limit} bytes, the limit for {kind}", code="body_too_large")


class BodyTimeout(HttpError):
    status = 408

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request body did not arrive within {timeout_s:g} s", code="body_timeout")


class BadLength(HttpError):
    def __init__(self) -> None:
        super().__init__("Content-Length is not a number", code="invalid_content_length")


def media_type(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return value.decode("latin-1").split(";")[0].strip().lower()
    return ""


class BodyLimit:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.default = settings.max_body_bytes
        self.by_media_type = {
            "multipart/form-data": settings.max_upload_bytes,
            "application/sdp": settings.whep_max_sdp_bytes,
            "application/trickle-ice-sdpfrag": settings.whep_max_trickle_bytes,
        }
        self.timeout_s = settings.body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = media_type(scope)
        limit = self.by_media_type.get(kind, self.default)
        declared = next((value for name, value in scope.get("headers", []) if name == b"content-length"), None)
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await asgi_error(scope, send, BadLength())
                return
            if length > limit:
                await asgi_error(scope, send, BodyTooLarge(limit, kind), {"Connection": "close"})
                return
        deadline = time.monotonic() + self.timeout_s
        received = 0
        body_done = False
        failure: EngineError | None = None
        started = False

        async def limited_receive() -> Message:
            nonlocal received, body_done, failure
            if failure is not None:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()  # after the body: only the client's disconnect, whenever it comes
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                failure = BodyTimeout(self.timeout_s)
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    failure = BodyTooLarge(limit, kind)
                    return {"type": "http.disconnect"}
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if failure is not None:
                return  # the route's answer to a body it could not read; ours goes instead
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if failure is None:
                raise
        if failure is not None and not started:
            await asgi_error(scope, send, failure, {"Connection": "close"})


class TooManyWebSockets(Overloaded):
    def __init__(self, limit: int) -> None:
        super().__init__(
            retry_after_s=1,
            message=f"the server already holds {limit} WebSocket connections; retry shortly",
            code="too_many_connections",
        )


class ManagedSocket:
    """One WebSocket the server may close on its own: when idle past ``timeout_s``, or at shutdown.

    The route keeps reading and writing as usual; when the server closes the socket, the route's next receive
    answers ``websocket.disconnect``. A route may set ``on_shutdown`` to say goodbye in its own protocol first,
    and ``busy`` to say when it has a stream in progress (a drain waits for it; without it, only the engine's
    streams are waited for).
    """

    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.last_activity = time.monotonic()
        self.closed = False
        self.on_shutdown: Callable[[], Awaitable[None]] | None = None
        self.busy: Callable[[], bool] = lambda: False
        """Set by the route: whether the socket has a stream in progress (a drain waits for it)."""
        self.owes_audio: Callable[[], bool] = lambda: False
        """Set by the route: whether the client waits on the server (speech it finished sending, still being made
        or sent); the idle timeout waits while it does."""
        self._closing = asyncio.Event()
        self._send: Send | None = None

    async def close(self, code: int, reason: str) -> None:
        if self.closed or self._send is None:
            return
        self.closed = True
        self._closing.set()
        try:
            await self._send({"type": "websocket.close", "code": code, "reason": reason})
        except Exception:  # the client went first
            pass

    async def shut_down(self, grace_s: float = 2.0) -> None:
        """The route's goodbye (``on_shutdown``), then close 1001 if the route did not close it."""
        if self.on_shutdown is not None and not self.closed:
            try:
                await asyncio.wait_for(self.on_shutdown(), grace_s)
            except Exception:
                pass
        await self.close(CLOSE_GOING_AWAY, SHUTTING_DOWN)

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        pending: asyncio.Future[Message] | None = None
        closing = asyncio.ensure_future(self._closing.wait())

        async def watched_send(message: Message) -> None:
            self.last_activity = time.monotonic()
            if message["type"] == "websocket.close":
                self.closed = True
            await send(message)

        self._send = send

        async def watched_receive() -> Message:
            nonlocal pending
            while not self.closed:
                if pending is None:
                    pending = asyncio.ensure_future(receive())
                remaining = self.last_activity + self.idle_timeout_s - time.monotonic()
                await asyncio.wait((pending, closing), timeout=max(0.0, remaining), return_when=asyncio.FIRST_COMPLETED)
                if pending.done():
                    message, pending = pending.result(), None
                    self.last_activity = time.monotonic()
                    return message
                if time.monotonic() - self.last_activity >= self.idle_timeout_s:
                    if self.owes_audio():  # a slow first audio (a queue, a loaded machine) is not the client idling
                        self.last_activity = time.monotonic()
                    else:
                        await self.close(CLOSE_NORMAL, "idle timeout")
            return {"type": "websocket.disconnect", "code": CLOSE_NORMAL}

        try:
            await app(scope, watched_receive, watched_send)
        finally:
            self.closed = True
            for future in (pending, closing):
                if future is not None and not future.done():
                    future.cancel()


class OpenSockets:
    """The WebSockets open now (for the limit and for shutdown)."""

    def __init__(self) -> None:
        self.sockets: set[ManagedSocket] = set()

    def busy(self) -> bool:
        return any(socket.busy() for socket in list(self.sockets))

    async def shut_down_all(self) -> None:
        await asyncio.gather(*(socket.shut_down() for socket in list(self.sockets)), return_exceptions=True)


def managed_socket(scope: Scope) -> ManagedSocket | None:
    """The server's handle on this WebSocket (to set ``on_shutdown``)."""
    socket: ManagedSocket | None = scope.get("state", {}).get("socket")
    return socket


class WebSocketLimits:
    def __init__(self, app: ASGIApp, settings: Settings, sockets: OpenSockets) -> None:
        self.app = app
        self.max_connections = settings.ws_max_connections
        self.idle_timeout_s = settings.ws_idle_timeout_s
        self.open = sockets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if len(self.open.sockets) >= self.max_connections:
            await asgi_error(scope, send, TooManyWebSockets(self.max_connections))
            return
        socket = ManagedSocket(self.idle_timeout_s)
        scope.setdefault("state", {})["socket"] = socket
        self.open.sockets.add(socket)
        try:
            await socket.run(self.app, scope, receive, send)
        finally:
            self.open.sockets.discard(socket)
