"""Text that remembers, for each of its characters, where it came from in the text a client sent.

Every rewrite of normalisation (``engine/text.py``, ``engine/spoken.py``) goes through :class:`MappedText`, so a
word of the rewritten text maps back to what the client wrote: word timings point at the client's characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

Span = tuple[int, int]

Pieces = Sequence[tuple[str, int | str | None]]
"""A replacement in pieces: each piece's text and the group of the match it maps to (``None``: the whole match)."""


@dataclass(frozen=True)
class MappedText:
    """Text and, for each of its characters, the span ``[start, end)`` of the original text it came from.

    Normalisation rewrites text (``$100`` -> ``one hundred dollars``); word timings must point at what the client
    sent, so every rewrite keeps this map: copied characters keep their own span, replacements take the span of what
    they replaced."""

    text: str
    spans: tuple[Span, ...]

    @classmethod
    def of(cls, text: str, offset: int = 0) -> MappedText:
        return cls(text, tuple((offset + i, offset + i + 1) for i in range(len(text))))

    @classmethod
    def spanning(cls, text: str, span: Span) -> MappedText:
        """``text`` that came, all of it, from ``span``."""
        return cls(text, (span,) * len(text))

    @staticmethod
    def join(parts: Iterable[MappedText]) -> MappedText:
        parts = list(parts)
        return MappedText("".join(p.text for p in parts), tuple(s for p in parts for s in p.spans))

    def __len__(self) -> int:
        return len(self.text)

    def __getitem__(self, index: slice) -> MappedText:
        return MappedText(self.text[index], self.spans[index])

    def source(self, start: int, end: int) -> Span:
        """The original span that characters ``[start, end)`` came from."""
        if start >= end:
            at = self.spans[start][0] if start < len(self.spans) else (self.spans[-1][1] if self.spans else 0)
            return at, at
        return min(s for s, _ in self.spans[start:end]), max(e for _, e in self.spans[start:end])

    def sub(self, pattern: re.Pattern[str], replacement: str | Callable[[re.Match[str]], str | Pieces]) -> MappedText:
        """``pattern.sub`` that maps each replacement onto the span of the text it replaced.

        A callable may return the replacement in pieces, each mapped onto one group of the match (``July 4`` ->
        ``July`` from the month, ``fourth`` from the day), so its words keep their own places in the original."""
        parts: list[MappedText] = []
        last = 0
        for match in pattern.finditer(self.text):
            new = replacement if isinstance(replacement, str) else replacement(match)
            if new == match.group(0):
                continue
            parts.append(self[last : match.start()])
            whole = self.source(match.start(), match.end())
            if isinstance(new, str):
                parts.append(MappedText.spanning(new, whole))
            else:
                for piece, group in new:
                    span = whole
                    if group is not None and match.start(group) >= 0:
                        span = self.source(match.start(group), match.end(group))
                    parts.append(MappedText.spanning(piece, span))
            last = match.end()
        if not parts:
            return self
        parts.append(self[last:])
        return MappedText.join(parts)

    def through(self, outer: MappedText) -> MappedText:
        """This text, made from ``outer.text``, mapped onto what ``outer`` came from."""
        if not outer.spans:
            return MappedText(self.text, ((0, 0),) * len(self.text))
        return MappedText(self.text, tuple(outer.source(start, end) for start, end in self.spans))

    def translate(self, table: dict[int, str]) -> MappedText:
        texts: list[str] = []
        spans: list[Span] = []
        for char, span in zip(self.text, self.spans, strict=True):
            new = table.get(ord(char), char)
            texts.append(new)
            spans.extend([span] * len(new))
        return MappedText("".join(texts), tuple(spans))

    def strip(self) -> MappedText:
        start = len(self.text) - len(self.text.lstrip())
        return self[start : start + len(self.text.strip())]
