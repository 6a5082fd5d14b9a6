"""Response bodies made from a speech stream: encoded audio, or server-sent events.

The body owns the stream's end: when the client goes away, Starlette cancels
the body and the ``finally`` cancels the stream, which frees its slot in the
scheduler within one chunk.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable

from rtvoice.engine.audio.encoding import Encoder, WavEncoder
from rtvoice.engine.stream import SpeechStream


async def audio_body(stream: SpeechStream, encoder: Encoder) -> AsyncIterator[bytes]:
    try:
        if isinstance(encoder, WavEncoder):
            yield encoder.header()
        async for pcm in stream.audio():
            data = encoder.encode(pcm)
            if data:
                yield data
        tail = encoder.finish()
        if tail:
            yield tail
    finally:
        stream.cancel()


def sse_event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_body(
    stream: SpeechStream, encoder: Encoder, usage: Callable[[SpeechStream], dict[str, int]]
) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` with base64 audio, then ``speech.audio.done``."""
    try:
        async for data in audio_body(stream, encoder):
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        yield sse_event({"type": "speech.audio.done", "usage": usage(stream)})
    finally:
        stream.cancel()
