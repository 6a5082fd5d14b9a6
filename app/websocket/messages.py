"""The messages of ``/v1/tts/stream``: what a client sends (JSON text frames) and the events the server sends back.

Client messages are checked one field set at a time, by the connection, after the checks of its own state (a
``text`` after ``end`` is ``input_closed`` whatever it carries), so each model's ``parse`` raises the protocol's
error for a bad field. Server events are typed too; ``wire`` is the JSON object that goes out, in field order.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rtvoice.app.errors import error_fields, invalid_value
from rtvoice.app.fields import InputType, Lexicons, Normalize, Speed
from rtvoice.app.words import delivered, mark_fields, word_fields
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.stream import MarkTiming, WordTiming

MessageType = Literal["start", "text", "flush", "cancel", "end"]
MESSAGE_TYPES: tuple[str, ...] = get_args(MessageType)
Encoding = Literal["pcm_s16le"]
ENCODINGS: tuple[str, ...] = get_args(Encoding)


def message_type(body: Any) -> MessageType:
    """The ``type`` of a client message; InvalidRequest when it is not an object with a known string ``type``."""
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        raise InvalidRequest("a message is a JSON object with a string 'type'", code="invalid_message", param="type")
    kind = body["type"]
    if kind not in MESSAGE_TYPES:
        raise InvalidRequest(
            f"unknown message type {kind!r}; valid types: {', '.join(MESSAGE_TYPES)}", code="unknown_type", param="type"
        )
    return kind


# -- client -> server -------------------------------------------------------------------------------


class ClientMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Any:
        """The message, or the InvalidRequest that names its first bad field."""
        try:
            return cls.model_validate(body)
        except ValidationError as error:
            raise invalid_value(error) from error


class StartMessage(ClientMessage):
    type: Literal["start"] = "start"
    voice: str | None = Field(None, description="A voice id from /voices (or an alias); the default when omitted.")
    sample_rate: int | None = Field(None, description="Output rate; the voice's own rate when omitted.")
    encoding: str = Field("pcm_s16le", description="Binary frames' format: int16 little-endian mono PCM.")
    speed: Speed = 1.0
    seed: int | None = Field(None, description="Makes each utterance's random draws reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: Lexicons = Field(default_factory=list)

    @classmethod
    def parse(cls, body: dict[str, Any]) -> StartMessage:
        start: StartMessage = super().parse(body)
        if start.encoding not in ENCODINGS:
            raise InvalidRequest(
                f"unsupported encoding {start.encoding!r}; supported: {', '.join(ENCODINGS)}",
                code="unsupported_encoding",
                param="encoding",
            )
        return start


class TextMessage(ClientMessage):
    type: Literal["text"] = "text"
    text: StrictStr
    """A fragment of any size (empty ones are ignored)."""

    @classmethod
    def parse(cls, body: dict[str, Any]) -> TextMessage:
        try:
            return cls.model_validate(body)
        except ValidationError as error:
            raise InvalidRequest("'text' must be a string", code="invalid_message", param="text") from error


class FlushMessage(ClientMessage):
    type: Literal["flush"] = "flush"


class CancelMessage(ClientMessage):
    type: Literal["cancel"] = "cancel"


class EndMessage(ClientMessage):
    type: Literal["end"] = "end"


# -- server -> client -------------------------------------------------------------------------------


class ServerEvent(BaseModel):
    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()
    """Fields left out of the event when they have no value (others go out as ``null``)."""

    def wire(self) -> dict[str, Any]:
        absent = {name for name in self.OMITTED_WHEN_NONE if getattr(self, name) is None}
        return self.model_dump(exclude=absent)


class StartedEvent(ServerEvent):
    type: Literal["started"] = "started"
    voice: str
    sample_rate: int
    encoding: Encoding = "pcm_s16le"
    speed: float
    seed: int | None


class AudioStartEvent(ServerEvent):
    type: Literal["audio_start"] = "audio_start"
    utterance: int
    sample_rate: int
    encoding: Encoding = "pcm_s16le"
    ttfa_ms: float


class WordEvent(ServerEvent):
    """Sent just before the binary frame that holds the word's start (fields: ``app/words.py``)."""

    type: Literal["word"] = "word"
    utterance: int
    text: str
    char_start: int
    char_end: int
    start_s: float
    end_s: float
    approximate: bool

    @classmethod
    def of(cls, word: WordTiming, utterance: int) -> WordEvent:
        return cls(utterance=utterance, **word_fields(word))


class MarkEvent(ServerEvent):
    """An SSML ``<mark>`` reached: sent just before the binary frame that holds its position (fields:
    ``app/words.py``)."""

    type: Literal["mark"] = "mark"
    utterance: int
    name: str
    char_start: int
    start_s: float

    @classmethod
    def of(cls, mark: MarkTiming, utterance: int) -> MarkEvent:
        return cls(utterance=utterance, **mark_fields(mark))


class SegmentDoneEvent(ServerEvent):
    type: Literal["segment_done"] = "segment_done"
    utterance: int
    index: int
    text: str


class SessionTotals(BaseModel):
    utterances: int
    audio_s: float


class DoneEvent(ServerEvent):
    OMITTED_WHEN_NONE = frozenset({"compute_s", "late_chunks", "session", "ignored"})

    type: Literal["done"] = "done"
    utterance: int | None
    """None for the ``done`` of an ``end`` with nothing left to speak."""
    final: bool
    audio_s: float
    segments: int
    text_chars: int
    ttfa_ms: float | None
    compute_s: float | None = None
    late_chunks: int | None = None
    session: SessionTotals | None = None
    """On the final one only."""
    ignored: list[str] | None = None
    """What the utterance's markup asked for that was not done (an element its voice cannot do); when anything."""


class Delivered(BaseModel):
    """What a cancelled utterance got across: the audio sent and the last word whose audio was all sent."""

    utterance: int
    audio_s: float
    last_word: dict[str, Any] | None
    """A ``word`` event's fields (without ``type`` and ``utterance``); None before the first whole word."""

    @classmethod
    def of(cls, utterance: int, words: list[WordTiming], audio_s: float) -> Delivered:
        return cls(utterance=utterance, **delivered(words, audio_s))


class CancelledEvent(ServerEvent):
    type: Literal["cancelled"] = "cancelled"
    utterances: list[int]
    delivered: list[Delivered]


class ErrorEvent(ServerEvent):
    OMITTED_WHEN_NONE = frozenset({"retry_after_s", "utterance"})

    type: Literal["error"] = "error"
    code: str
    message: str
    param: str | None
    retry_after_s: int | None = None
    utterance: int | None = None
    """The utterance that failed or was cut short."""

    @classmethod
    def of(cls, error: EngineError, utterance: int | None = None) -> ErrorEvent:
        return cls(**error_fields(error), utterance=utterance)
