"""Response bodies made from a speech stream: encoded audio, or server-sent events.

The body owns the stream's end: when the client goes away, Starlette cancels
the body and the ``finally`` cancels the stream, which frees its slot in the
scheduler within one chunk.

``SpeechResponse`` sends its status at once (a client learns it was admitted, even while its stream waits in the
queue), so a stream that fails cannot change it: its body is cut off without the chunked encoding's last chunk,
which every HTTP client reports as an incomplete body, rather than ending as a short but valid file.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Send

from rtvoice.app.errors import engine_error_body
from rtvoice.app.request_context import track_stream
from rtvoice.app.words import mark_fields, word_fields
from rtvoice.engine.audio.encoding import Encoder, WavEncoder
from rtvoice.engine.errors import EngineError
from rtvoice.engine.stream import AudioChunk, MarkTiming, SpeechStream, WordTiming

log = logging.getLogger(__name__)


IGNORED_HEADER = "X-SSML-Ignored"
"""What the text's markup asked for that was not done (``SpeechStream.ignored``), ``; ``-separated."""


def ignored_value(stream: SpeechStream, charset: str = "latin-1") -> str | None:
    """``IGNORED_HEADER``'s value for ``stream`` (None when nothing was ignored), in what a header may hold: HTTP's
    Latin-1, or gRPC metadata's ASCII; what cannot be written there is replaced."""
    if not stream.ignored:
        return None
    return "; ".join(stream.ignored).encode(charset, "replace").decode(charset)


def stream_headers(stream: SpeechStream) -> dict[str, str]:
    """The headers every speech response carries: the stream's output rate and the voice that speaks; and what of
    its text's markup was ignored, when anything was (known at once for a whole text)."""
    headers = {"X-Sample-Rate": str(stream.sample_rate), "X-Voice": stream.voice.info.id}
    ignored = ignored_value(stream)
    if ignored is not None:
        headers[IGNORED_HEADER] = ignored
    return headers


WORD_EVENT = "speech.word"
"""The SSE extension event for a word's timing: a type outside OpenAI's ``speech.audio.*``."""
MARK_EVENT = "speech.mark"
"""The SSE extension event for an SSML ``<mark>`` reached."""


async def encoded_events(stream: SpeechStream, encoder: Encoder) -> AsyncIterator[bytes | WordTiming | MarkTiming]:
    """The stream's audio as ``encoder`` writes it (a WAV header first), and its words and marks, each before the
    audio that holds its start."""
    track_stream(stream)
    try:
        if isinstance(encoder, WavEncoder):
            yield encoder.header()
        async for event in stream.events():
            if isinstance(event, (WordTiming, MarkTiming)):
                yield event
            elif isinstance(event, AudioChunk):
                data = encoder.encode(event.pcm)
                if data:
                    yield data
        tail = encoder.finish()
        if tail:
            yield tail
    finally:
        stream.cancel()


async def audio_body(stream: SpeechStream, encoder: Encoder) -> AsyncIterator[bytes]:
    """The stream's audio as ``encoder`` writes it (a WAV header first)."""
    async for item in encoded_events(stream, encoder):
        if isinstance(item, bytes):
            yield item


def sse_event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_body(
    stream: SpeechStream, encoder: Encoder, usage: Callable[[SpeechStream], dict[str, int]]
) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` with base64 audio, then ``speech.audio.done``; and, as an
    extension OpenAI's clients pass over (they act on the types they know), a ``speech.word`` event for each word
    before the delta that holds its start, and a ``speech.mark`` for each SSML mark (``app/words.py`` has their
    fields).

    A failure sends an ``error`` event (the error body) before the body is cut off."""
    try:
        async for item in encoded_events(stream, encoder):
            if isinstance(item, WordTiming):
                yield sse_event({"type": WORD_EVENT, **word_fields(item)})
            elif isinstance(item, MarkTiming):
                yield sse_event({"type": MARK_EVENT, **mark_fields(item)})
            else:
                yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(item).decode()})
        # ttfa_ms, an extension: the server's time to first audio, for a client to set beside its own.
        ttfa_s = stream.stats().ttfa_s
        ttfa_ms = None if ttfa_s is None else round(ttfa_s * 1000, 1)
        yield sse_event({"type": "speech.audio.done", "usage": usage(stream), "ttfa_ms": ttfa_ms})
    except EngineError as error:
        yield sse_event({"type": "error", **engine_error_body(error)})
        raise
    finally:
        stream.cancel()


class SpeechResponse(StreamingResponse):
    """A streamed speech body that, when its stream fails, ends without its last chunk: visibly broken."""

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except EngineError as error:
            # No final chunk: the connection closes with the body unterminated, which clients detect.
            log.warning("synthesis failed after the response started: %s; the body is cut off", error.message)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
