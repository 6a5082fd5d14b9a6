"""Cartesia's TTS API: the WebSocket ``/tts/websocket`` and ``POST /tts/bytes``.

Clients written for Cartesia (Pipecat's ``CartesiaTTSService``, LiveKit's ``cartesia.TTS``) work with nothing
changed but the URL. ``requests.py``: the request models and their mapping onto the engine's ``SynthesisRequest``;
``messages.py``: what the WebSocket sends; ``websocket.py``: the WebSocket's contexts, receive loop and senders;
``tts_bytes.py``: ``POST /tts/bytes``.
"""

from __future__ import annotations

from fastapi import APIRouter

from rtvoice.app.cartesia import tts_bytes, websocket

router = APIRouter()
"""Both of Cartesia's routes, for the app to include (each route's own router carries its tag)."""
router.include_router(websocket.router)
router.include_router(tts_bytes.router)
