"""Response bodies made from a speech stream: encoded audio, or server-sent events.

The body owns the stream's end: when the client goes away, Starlette cancels
the body and the ``finally`` cancels the stream, which frees its slot in the
scheduler within one chunk.

``SpeechResponse`` sends its status only with the first bytes of audio, so a stream that fails before any
audio gets a real error status and body (500 ``synthesis_failed``). One that fails later cannot change its
status: its body is cut off without the chunked encoding's last chunk, which every HTTP client reports as an
incomplete body, rather than ending as a short but valid file.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Send

from rtvoice.app.errors import engine_error_response, error_body
from rtvoice.app.request_context import track_stream
from rtvoice.engine.audio.encoding import Encoder, WavEncoder
from rtvoice.engine.errors import EngineError
from rtvoice.engine.stream import SpeechStream

log = logging.getLogger(__name__)


async def audio_body(stream: SpeechStream, encoder: Encoder) -> AsyncIterator[bytes]:
    """The stream's audio as ``encoder`` writes it; a WAV header goes out with the first audio."""
    track_stream(stream)
    try:
        prefix = encoder.header() if isinstance(encoder, WavEncoder) else b""
        async for pcm in stream.audio():
            data = prefix + encoder.encode(pcm)
            if data:
                prefix = b""
                yield data
        tail = prefix + encoder.finish()
        if tail:
            yield tail
    finally:
        stream.cancel()


def sse_event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_body(
    stream: SpeechStream, encoder: Encoder, usage: Callable[[SpeechStream], dict[str, int]]
) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` with base64 audio, then ``speech.audio.done``.

    A failure after the first event sends an ``error`` event (the error body) before the body is cut off."""
    sent = False
    try:
        async for data in audio_body(stream, encoder):
            sent = True
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        yield sse_event({"type": "speech.audio.done", "usage": usage(stream)})
    except EngineError as error:
        if sent:
            yield sse_event({"type": "error", **error_body(error.message, error.type, error.code, error.param)})
        raise
    finally:
        stream.cancel()


class SpeechResponse(StreamingResponse):
    """A streamed speech body whose status waits for its first bytes, and which fails visibly after them."""

    async def stream_response(self, send: Send) -> None:
        iterator = aiter(self.body_iterator)
        try:
            first = await anext(iterator, b"")
        except EngineError as error:
            log.warning("synthesis failed before any audio: %s", error.message)
            response = engine_error_response(error)
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": response.raw_headers})
            await send({"type": "http.response.body", "body": response.body})
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except EngineError as error:
            # No final chunk: the connection closes with the body unterminated, which clients detect.
            log.warning("synthesis failed after the response started: %s; the body is cut off", error.message)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
