"""What the WebSocket protocols share: one receive loop, one writer for several tasks, and a session's start and end.

The WebSocket protocols (``/v1/tts/stream``, Cartesia's ``/tts/websocket``) each run ``receive_loop`` (messages
to the protocol's handler until the client leaves, then its work freed) and one or more sender tasks. They all write
through a ``SocketWriter`` (one lock, so frames never interleave); once a send fails or the socket is closed, every
later send raises ``Gone`` and the senders stop. ``serve_session`` accepts a socket, turns it away while the engine
is not ready, and closes it if the session fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from fastapi import WebSocket
from starlette.websockets import WebSocketState

from rtvoice.app.close_codes import CLOSE_INTERNAL_ERROR, CLOSE_TRY_AGAIN_LATER, INTERNAL_ERROR
from rtvoice.app.limits import managed_socket
from rtvoice.app.state import engine_of
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest

log = logging.getLogger(__name__)


class Gone(Exception):
    """The socket is closed: stop sending."""


class SocketWriter:
    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket
        self.closed = False
        self._lock = asyncio.Lock()

    async def send(self, text: str | None = None, data: bytes | None = None) -> None:
        """One text or binary frame; raises Gone when the socket is closed or the client left."""
        async with self._lock:
            if self.closed:
                raise Gone
            try:
                if data is not None:
                    await self.ws.send_bytes(data)
                else:
                    await self.ws.send_text(text or "")
            except Exception as error:  # the client is gone: every transport says so differently
                self.closed = True
                raise Gone from error

    async def send_json(self, payload: dict[str, Any]) -> None:
        await self.send(json.dumps(payload, separators=(",", ":")))

    async def close(self, code: int, reason: str = "") -> None:
        """Close once (later sends raise Gone); a socket already gone is left as it is."""
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.ws.application_state is WebSocketState.CONNECTED:
                try:
                    await self.ws.close(code, reason)
                except Exception:
                    pass


async def received(websocket: WebSocket) -> AsyncIterator[dict[str, Any]]:
    """The socket's messages (ASGI ``websocket.receive`` events) until the client disconnects."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if not isinstance(message, dict):  # ASGI events are dicts; starlette types them as MutableMapping
            message = dict(message)
        yield message


async def receive_loop(
    websocket: WebSocket,
    handle: Callable[[dict[str, Any]], Awaitable[None]],
    release: Callable[[], Awaitable[None]],
    on_error: Callable[[EngineError], Awaitable[None]] | None = None,
) -> None:
    """Each message through ``handle`` until the client disconnects or a reply finds the socket gone; then, however
    the loop ends, ``release`` frees the session's work. An ``EngineError`` from ``handle`` goes to ``on_error``
    and the loop goes on (without ``on_error`` it propagates: the protocol answers its errors in ``handle``)."""
    try:
        async for message in received(websocket):
            try:
                await handle(message)
            except EngineError as error:
                if on_error is None:
                    raise
                await on_error(error)
            except Gone:
                return  # the socket closed under a reply
    finally:
        await release()


def json_of(message: dict[str, Any]) -> Any:
    """The JSON a text frame carries; InvalidRequest for a binary frame (``invalid_message``) or bad JSON."""
    if message.get("text") is None:
        raise InvalidRequest("binary frames are not accepted; send JSON text frames", code="invalid_message")
    try:
        return json.loads(message["text"])
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"message is not valid JSON: {error}", code="invalid_json") from error


class Session(Protocol):
    writer: SocketWriter

    async def run(self) -> None: ...

    def speaking(self) -> bool:
        """Whether the session has speech in progress (a drain waits for it)."""

    def owes_audio(self) -> bool:
        """Whether the client waits on the server: speech it finished sending is still being made or sent."""

    async def shut_down(self) -> None:
        """The drain ran out: stop, say ``server_shutting_down`` in the protocol's words, close 1001."""


async def serve_session(
    websocket: WebSocket,
    path: str,
    error_event: Callable[[EngineError], dict[str, Any]],
    session: Callable[[WebSocket, Engine], Session],
) -> None:
    """Accept, then run ``session``; while the voices are still loading, the protocol's error event and close
    1013 instead. A session that fails closes with 1011."""
    await websocket.accept()
    engine: Engine = websocket.app.state.engine
    try:
        engine_of(websocket)
    except EngineError as error:
        await websocket.send_text(json.dumps(error_event(error)))
        await websocket.close(CLOSE_TRY_AGAIN_LATER, "not ready")
        return
    websocket.app.state.request_metrics.count("websocket", path, "101")
    connection = session(websocket, engine)
    socket = managed_socket(websocket.scope)
    if socket is not None:  # the server's handle: a drain waits while it speaks, then lets it say goodbye
        socket.busy = connection.speaking
        socket.owes_audio = connection.owes_audio
        socket.on_shutdown = connection.shut_down
    try:
        await connection.run()
    except Exception:
        log.exception("websocket session on %s failed", path)
        await connection.writer.close(CLOSE_INTERNAL_ERROR, INTERNAL_ERROR)
