"""Request fields every transport declares the same way."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema

from rtvoice.engine.models.base import MAX_SPEED, MIN_SPEED

__all__ = ["MAX_SPEED", "MIN_SPEED", "InputType", "LexiconList", "Lexicons", "Normalize", "Speed"]

Speed = Annotated[float, Field(ge=MIN_SPEED, le=MAX_SPEED)]
"""A speaking rate (2.0 is twice as fast) in the range every voice's transport accepts; a voice may honour fewer
(``Engine.check_options``)."""

Normalize = Annotated[
    bool,
    Field(
        description="rtvoice extension: read numbers, money, dates, times, units and abbreviations as a person "
        "would (true, the default); false reads the text as sent, for text that is already in its spoken form."
    ),
]
"""The per-request switch of the text normaliser (``SynthesisRequest.normalize``)."""

InputType = Annotated[
    Literal["auto", "text", "ssml"],
    Field(
        description="rtvoice extension: what the text is. auto (the default): SSML when it starts with <speak, "
        'else plain text (which may hold <break time="..."/>); ssml or text force it either way.'
    ),
]
"""``SynthesisRequest.text_type``: every transport that takes text names it ``input_type``."""

MAX_LEXICONS = 16
LEXICONS_DESCRIPTION = (
    "rtvoice extension: ids of uploaded pronunciation lexicons (POST /v1/lexicons) to read the text with, first "
    "match winning; the server's own lexicons for the voice's language apply after them."
)

Lexicons = Annotated[list[str], Field(max_length=MAX_LEXICONS, description=LEXICONS_DESCRIPTION)]
"""``SynthesisRequest.lexicons``, where a protocol has lists (JSON)."""


def _comma_separated(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


LexiconList = Annotated[
    list[str],
    BeforeValidator(_comma_separated),
    Field(max_length=MAX_LEXICONS),
    WithJsonSchema({"type": "string", "description": f"{LEXICONS_DESCRIPTION} Comma-separated."}),
]
"""``SynthesisRequest.lexicons`` where a protocol's values are strings (a form field, a query parameter, gRPC
metadata): the ids comma-separated."""
