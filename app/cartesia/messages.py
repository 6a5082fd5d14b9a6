"""The messages Cartesia's WebSocket sends: ``chunk``, ``flush_done``, ``done``, ``timestamps`` and ``error``.

Every message carries its ``context_id``. An ``error`` is ``done: true``: the context it names has ended, and its id
may open a new one.

Word timestamps: with ``add_timestamps``, each context's words come as ``timestamps`` messages with
``word_timestamps`` (``words``, ``start``, ``end``: seconds from the start of the context's audio, cumulative across
its transcripts), sent just before the ``chunk`` that holds the words' starts: a client knows which words were
heard when it stops playback. A word is the client's own token, punctuation included (``"$100,"``), since
clients align the words with the text they sent (LiveKit finds each in its transcript, in order); markup is never
part of one (``<break …/>``, ``<speak>``, a ``<sub>``'s tags: its word is the element's text; each letter of a
``<spell>`` is its own word). CosyVoice2 voices' times are estimates (rtvoice's other routes say ``approximate``;
Cartesia's message has no place for it).

Extensions, in fields Cartesia's clients pass over (Pipecat's and LiveKit's services read only the fields they
know; an unknown message type would be an error to Pipecat, and a ``timestamps`` message without
``word_timestamps`` would break its receive loop): an SSML ``<mark>`` reached is in ``marks`` of a ``timestamps``
message (``name``, ``char_start`` in all the context's text, ``start_s``), whose ``word_timestamps`` may then be
empty; ``done`` carries ``ignored`` when the context's markup asked for something that was not done.
"""

from __future__ import annotations

import base64
import bisect
import re
import uuid
from collections.abc import Sequence
from typing import Any

from rtvoice.app.errors import http_status
from rtvoice.app.words import mark_fields
from rtvoice.engine.errors import EngineError, Overloaded
from rtvoice.engine.stream import MarkTiming, WordTiming

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


def done_message(context_id: str, ignored: Sequence[str] = ()) -> dict[str, Any]:
    """The context's end; ``ignored`` (an extension, when there is any): what its markup asked for that was not
    done (``SpeechStream.ignored``)."""
    message: dict[str, Any] = {"type": "done", "done": True, "status_code": STATUS_PARTIAL, "context_id": context_id}
    if ignored:
        message["ignored"] = list(ignored)
    return message


def timestamps_message(
    context_id: str,
    words: Sequence[str],
    starts_s: Sequence[float],
    ends_s: Sequence[float],
    marks: Sequence[MarkTiming] = (),
) -> dict[str, Any]:
    """Word timings (seconds in the context's audio) as Cartesia's ``timestamps`` message: the one place where
    rtvoice's word timings become ``word_timestamps``; SSML marks reached (an extension) in ``marks``."""
    message: dict[str, Any] = {
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
    if marks:
        message["marks"] = [mark_fields(mark) for mark in marks]
    return message


_TAG = re.compile(r"""<[A-Za-z/!?](?:[^<>"']|"[^"]*"|'[^']*')*>""")
"""A tag (SSML's, or an inline one such as ``<break …/>`` and ``<spell>``), a comment or a declaration: markup,
never part of a word's token."""
_JOINING = r"(?:&#?\w+;|[^\s\w<>])*"
"""What a word's token takes beside it: punctuation and symbols (an entity whole), not a blank, not another word's
letters or digits (a spelled code's letters are words of their own), not markup."""
_JOINING_AFTER = re.compile(_JOINING)
_JOINING_BEFORE = re.compile(_JOINING + r"\Z")
MAX_WIDENING = 32
"""Characters a token takes on either side of its word at most (a run of symbols is not a word's)."""


def client_token(
    transcript: str, transcripts_at: Sequence[int], word: WordTiming, previous_end: int
) -> tuple[str, int]:
    """The word as the client wrote it, as a token of its text: the word's own characters without the markup in
    them (a ``<sub>``'s word is the element's text), widened over the punctuation around it, not past a blank,
    markup, another word's letters, the previous word's token or the transcript it came in (a client may send
    sentences with no blank between them). Returns the token and its end."""
    first_in = bisect.bisect_right(transcripts_at, word.start) - 1
    last_in = bisect.bisect_right(transcripts_at, word.end - 1) - 1  # a word may span transcripts (LLM tokens)
    first = max(previous_end, transcripts_at[first_in] if first_in >= 0 else 0)
    last = transcripts_at[last_in + 1] if last_in + 1 < len(transcripts_at) else len(transcript)
    first, last = max(first, word.start - MAX_WIDENING), min(last, word.end + MAX_WIDENING)
    start, end = word.start, word.end
    if start > first:  # a word within the previous one's token (an overlap) takes only its own characters
        before = _JOINING_BEFORE.search(transcript, first, start)
        start = before.start() if before else start
    if end < last:
        after = _JOINING_AFTER.match(transcript, end, last)
        end = after.end() if after else end
    token = _TAG.sub("", transcript[start:end]).strip()
    return token or word.text, max(end, previous_end)


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
