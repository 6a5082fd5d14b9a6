"""The messages Cartesia's WebSocket sends: ``chunk``, ``flush_done``, ``done``, ``timestamps`` and ``error``.

Every message carries its ``context_id``. An ``error`` is ``done: true``: the context it names has ended, and its id
may open a new one.

Word timestamps: with ``add_timestamps``, each context's words come as ``timestamps`` messages with
``word_timestamps`` (``words``, ``start``, ``end``: seconds from the start of the context's audio, cumulative across
its transcripts), sent just before the ``chunk`` that holds the words' starts: a client knows which words were
heard when it stops playback. A word is the client's own token, punctuation included (``"$100,"``), since
clients align the words with the text they sent (LiveKit finds each in its transcript, in order). CosyVoice2 voices'
times are estimates (rtvoice's other routes say ``approximate``; Cartesia's message has no place for it).
"""

from __future__ import annotations

import base64
import bisect
import uuid
from collections.abc import Sequence
from typing import Any

from rtvoice.app.errors import http_status
from rtvoice.engine.errors import EngineError, Overloaded
from rtvoice.engine.stream import WordTiming

STATUS_PARTIAL = 206
"""Cartesia's ``status_code`` on every message of a context in progress."""
STATUS_TOO_MANY = 429
"""Cartesia's ``status_code`` for a concurrency limit: rtvoice's ``overloaded``."""


def chunk_message(context_id: str, data: bytes, flush_id: int) -> dict[str, Any]:
    return {
        "type": "chunk",
        "data": base64.b64encode(data).decode(),
        "done": False,
        "status_code": STATUS_PARTIAL,
        "flush_id": flush_id,
        "context_id": context_id,
    }


def flush_done_message(context_id: str, flush_id: int) -> dict[str, Any]:
    return {
        "type": "flush_done",
        "done": False,
        "flush_done": True,
        "flush_id": flush_id,
        "status_code": STATUS_PARTIAL,
        "context_id": context_id,
    }


def done_message(context_id: str) -> dict[str, Any]:
    return {"type": "done", "done": True, "status_code": STATUS_PARTIAL, "context_id": context_id}


def timestamps_message(
    context_id: str, words: Sequence[str], starts_s: Sequence[float], ends_s: Sequence[float]
) -> dict[str, Any]:
    """Word timings (seconds in the context's audio) as Cartesia's ``timestamps`` message: the one place where
    rtvoice's word timings become ``word_timestamps``."""
    return {
        "type": "timestamps",
        "done": False,
        "status_code": STATUS_PARTIAL,
        "context_id": context_id,
        "word_timestamps": {
            "words": list(words),
            "start": [round(s, 4) for s in starts_s],
            "end": [round(e, 4) for e in ends_s],
        },
    }


def client_token(
    transcript: str, transcripts_at: Sequence[int], word: WordTiming, previous_end: int
) -> tuple[str, int]:
    """The word as the blank-separated token of the client's text it belongs to: its span widened over the
    punctuation around it, not past a blank, the previous word's token or the transcript it came in (a client may
    send sentences with no blank between them). Returns the token and its end."""
    first_in = bisect.bisect_right(transcripts_at, word.start) - 1
    last_in = bisect.bisect_right(transcripts_at, word.end - 1) - 1  # a word may span transcripts (LLM tokens)
    first = max(previous_end, transcripts_at[first_in] if first_in >= 0 else 0)
    last = transcripts_at[last_in + 1] if last_in + 1 < len(transcripts_at) else len(transcript)
    start, end = word.start, word.end
    while start > first and not transcript[start - 1].isspace():
        start -= 1
    while end < last and not transcript[end].isspace():
        end += 1
    return transcript[start:end], end


def error_message(error: EngineError, context_id: str | None) -> dict[str, Any]:
    """Cartesia's WebSocket error event, from an engine error (its code, message and param are rtvoice's)."""
    payload: dict[str, Any] = {
        "type": "error",
        "done": True,
        "status_code": STATUS_TOO_MANY if isinstance(error, Overloaded) else http_status(error).status,
        "error_code": error.code,
        "title": error.code.replace("_", " ").capitalize(),
        "message": error.message,
        "param": error.param,
        "request_id": str(uuid.uuid4()),
        "context_id": context_id,
    }
    if error.retry_after_s is not None:
        payload["retry_after_s"] = error.retry_after_s
    return payload
