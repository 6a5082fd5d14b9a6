"""Writing to a WebSocket from several tasks: one lock so frames never interleave, and one way to say "gone".

The WebSocket protocols (``/v1/tts/stream``, Cartesia's ``/tts/websocket``) each have a receive loop and one
or more sender tasks. They all write through a ``SocketWriter``; once a send fails or the socket is closed,
every later send raises ``Gone`` and the senders stop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketState

# Close codes (RFC 6455 and IANA's registry).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013


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
