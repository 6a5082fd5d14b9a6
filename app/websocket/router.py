"""The route ``/v1/tts/stream``: a WebSocket for text in as it is written (an LLM's tokens), PCM out as soon as a
sentence ends. The protocol is in the README ("WebSocket protocol") and ``messages.py``."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from rtvoice.app.websocket.connection import Connection
from rtvoice.app.websocket.io import serve_session
from rtvoice.app.websocket.messages import ErrorEvent

router = APIRouter(tags=["WebSocket"])

PATH = "/v1/tts/stream"


@router.websocket(PATH)
async def tts_stream(websocket: WebSocket) -> None:
    """Streaming text in, PCM out; see the README for the protocol."""
    await serve_session(websocket, PATH, lambda error: ErrorEvent.of(error).wire(), Connection)
