"""Request fields every transport declares the same way."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rtvoice.engine.models.base import MAX_SPEED, MIN_SPEED

__all__ = ["MAX_SPEED", "MIN_SPEED", "Normalize", "Speed"]

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
