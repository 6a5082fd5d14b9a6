"""A request's plan: what its text asks for, in order, before any of it is normalised.

SSML and the inline tags of plain text (``engine/ssml.py``) become these items; the segmenter (``engine/text.py``)
cuts the speech into segments, which are normalised and phonemised, and hands pauses and marks on in their places.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtvoice.engine.mapped_text import MappedText


@dataclass(frozen=True)
class Prosody:
    """How a stretch of speech is said, relative to the request."""

    rate: float = 1.0
    """Multiplies the request's speed (the voice's session keeps the product within the speed bounds)."""
    volume: float = 1.0
    """Gain on the voice's amplitude."""


@dataclass(frozen=True)
class Speech:
    text: MappedText
    """To be said; every character mapped to the text as sent (an alias to its ``<sub>``)."""
    prosody: Prosody = Prosody()


@dataclass(frozen=True)
class Pause:
    seconds: float
    """Exact silence in the audio, whatever the speed."""
    position: int
    """Where it was asked for in the text as sent."""


@dataclass(frozen=True)
class Mark:
    name: str
    position: int
    """Where it stands in the text as sent: it is reached where the first word after it starts."""


@dataclass(frozen=True)
class Boundary:
    """A sentence or paragraph ends here (``</s>``, ``<p>``): the segment ends, whatever the punctuation."""

    position: int


PlanItem = Speech | Pause | Mark | Boundary
