"""Word timings as JSON: the fields every rtvoice transport sends for a word (WebSocket, WHEP DataChannel, SSE).

Cartesia's route sends its own format (``app/cartesia/messages.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rtvoice.engine.stream import MarkTiming, WordTiming


def word_fields(word: WordTiming) -> dict[str, Any]:
    """``text`` as the client wrote it; ``char_start``/``char_end`` in all the text it sent for the utterance;
    ``start_s``/``end_s`` in seconds of the utterance's audio as the client receives it; ``approximate`` for an
    estimate (a voice that does not know its timing)."""
    return {
        "text": word.text,
        "char_start": word.start,
        "char_end": word.end,
        "start_s": round(word.start_s, 4),
        "end_s": round(word.end_s, 4),
        "approximate": word.approximate,
    }


def mark_fields(mark: MarkTiming) -> dict[str, Any]:
    """An SSML ``<mark>`` reached: its ``name``, ``char_start`` (where it stands in the text as sent) and
    ``start_s`` (where the word after it starts in the audio), as Polly's speech marks and Azure's bookmarks say."""
    return {"name": mark.name, "char_start": mark.position, "start_s": round(mark.start_s, 4)}


def last_heard(words: Sequence[WordTiming], audio_s: float) -> WordTiming | None:
    """The last of ``words`` whose audio lies wholly within the first ``audio_s`` seconds."""
    heard = [word for word in words if word.end_s <= audio_s + 1e-6]
    return heard[-1] if heard else None


def delivered(words: Sequence[WordTiming], audio_s: float) -> dict[str, Any]:
    """What a cancelled utterance got across: its audio time and the last word whose audio it wholly holds."""
    word = last_heard(words, audio_s)
    return {"audio_s": round(audio_s, 4), "last_word": None if word is None else word_fields(word)}
