"""Text normalisation and segmentation.

Segments are what a model synthesises in one pass: sentences, and clauses of
sentences too long to wait for. The first segment of a stream is kept short
because its length sets the time to first audio; later ones are synthesised
while earlier audio plays.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rtvoice.engine.lexicon import Lexicon, apply_lexicons
from rtvoice.engine.mapped_text import MappedText, Span
from rtvoice.engine.plan import Boundary, Mark, Pause, PlanItem, Prosody, Speech
from rtvoice.engine.spoken import WetextBudget, is_abbreviation, spoken_form
from rtvoice.engine.ssml import MarkupRules, PlanReader

if TYPE_CHECKING:
    from rtvoice.engine.settings import EngineSettings

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CRLF = re.compile(r"\r\n?")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200b\u3000]+")
_AROUND_NEWLINE = re.compile(r"[^\S\n]*\n[^\S\n]*")
_TRANSLATE = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u00ab": '"',
        "\u00bb": '"',
        "\u2013": ", ",
        "\u2014": ", ",
        "\u2026": "...",
    }
)

_NUMBER_RANGE = re.compile(r"(?<=\d)[^\S\n]?\u2013[^\S\n]?(?=\d)")
"""An en dash between numbers is a range ("10\u201320", "ten to twenty"), not the pause it is elsewhere."""

_DASH = re.compile(r"[^\S\n]*[\u2013\u2014][^\S\n]*")
"""A dash between words is a pause, with the blanks around it: "R&D \u2014 it" reads "R and D, it"."""
_COMPARISON = re.compile(r"(?<=\d)[^\S\n]*(?P<sign>[<>]=?)[^\S\n]*(?=[\d\-])")
_COMPARISON_WORDS = {"<": " less than ", ">": " greater than ", "<=": " at most ", ">=": " at least "}
_BRACKETED_ADDRESS = re.compile(r"<(?P<address>[^<>\s@]+@[^<>\s@]+\.\w+|https?://[^<>\s]+)>")
"""An address in angle brackets (a mail header's form): the brackets are not read, the address is."""

_SENTENCE_END = re.compile(r"([.!?]+[\"')\]]*|[\u3002\uff01\uff1f]+)(\s+|$)|\n\s*\n|\n")
# A clause ends at a mark and a blank, once what follows has come and is no digit: "Jan. 5, 2027" and "1, 000" stay
# in one segment, so a date or number is read whole.
_CLAUSE_END = re.compile(r"[,;:\u3001\uff0c\uff1b](\s+(?=[^\s\d])|$)")


def _nfc(text: str) -> MappedText:
    """Unicode NFC, each composed character mapped to the base and combining marks it came from."""
    mapped = MappedText.of(text)
    if unicodedata.is_normalized("NFC", text):
        return mapped
    texts: list[str] = []
    spans: list[Span] = []
    start = 0
    for end in range(1, len(text) + 1):
        if end < len(text) and unicodedata.combining(text[end]):
            continue
        new = unicodedata.normalize("NFC", text[start:end])
        texts.append(new)
        spans.extend([(start, end)] * len(new))
        start = end
    if "".join(texts) != unicodedata.normalize("NFC", text):  # a composition across marks: map it as one piece
        whole = unicodedata.normalize("NFC", text)
        return MappedText(whole, ((0, len(text)),) * len(whole))
    return MappedText("".join(texts), tuple(spans))


def english_rules(language: str) -> bool:
    """English conventions (the spoken form of numbers, money, abbreviations...) apply to English and to
    multilingual ("mul") voices."""
    language = language.lower()
    return language.startswith("en") or language == "mul"


def normalize(text: str, language: str = "en", *, spoken: bool = True) -> str:
    """Clean ``text`` for a phonemiser: unicode, whitespace, and (``spoken``) its spoken form."""
    return normalize_mapped(text, language, spoken=spoken).text


def normalize_mapped(
    text: str, language: str = "en", *, spoken: bool = True, budget: WetextBudget | None = None
) -> MappedText:
    """``normalize`` that keeps, for each character it returns, where it came from in ``text``.

    ``spoken``: English (and "mul") text is rewritten as it is said (``engine/spoken.py``: "$5" -> "five dollars",
    "Dr." -> "Doctor"); without it the text is only cleaned. ``budget``: the request's wetext calls left."""
    mapped = _nfc(text)
    rewrite = spoken and english_rules(language)
    if rewrite:
        mapped = mapped.sub(_NUMBER_RANGE, "-")
        mapped = mapped.sub(_COMPARISON, lambda match: _COMPARISON_WORDS[match.group("sign")])
        mapped = mapped.sub(_BRACKETED_ADDRESS, lambda match: [(match.group("address"), "address")])
    mapped = mapped.sub(_DASH, ", ").translate(_TRANSLATE).sub(_CONTROL, " ").sub(_CRLF, "\n")
    mapped = _tidy(mapped)
    if rewrite:
        said = spoken_form(mapped, language, budget)
        if said is not mapped:
            mapped = _tidy(said)
    return mapped


def _tidy(mapped: MappedText) -> MappedText:
    """Blanks collapse within lines; lines lose the blanks at their ends; the text loses its blank lines at both
    ends."""
    return mapped.sub(_SPACES, " ").sub(_AROUND_NEWLINE, "\n").strip()


def _split_point(sentence: str, max_chars: int) -> int:
    """Where to cut ``sentence`` before ``max_chars``: at a clause, else a word boundary."""
    window = sentence[: max_chars + 1]
    clause_cuts = [m.end() for m in _CLAUSE_END.finditer(window) if m.end() >= max_chars // 4]
    if clause_cuts:
        return clause_cuts[-1]
    space = window.rfind(" ", max_chars // 4)
    return space + 1 if space > 0 else max_chars


SILENT_EDGES = "\"'()[]{}<>.,;:!?-*_~`\u00ab\u00bb"
"""Characters a word may start or end with that are not part of it (its word timing covers the rest)."""
_TOKEN = re.compile(r"\S+")


def spoken_tokens(text: str) -> list[Span]:
    """Spans of the blank-separated tokens of a segment's text: the units a voice times words by."""
    return [match.span() for match in _TOKEN.finditer(text)]


@dataclass(frozen=True)
class Word:
    """A word of a segment: as the client wrote it, and where a voice reads it."""

    text: str
    """As the client sent it (``$100``); for words that markup made (a ``<sub>``'s alias), the words said."""
    start: int
    """Character offset in all the text the client sent on this stream."""
    end: int
    spoken_start: int
    """Character offset in the segment's normalised text (where ``one hundred dollars`` starts)."""
    spoken_end: int


@dataclass(frozen=True)
class SegmentMark:
    """A ``<mark>`` in a segment: reached where its word starts."""

    name: str
    position: int
    """Where it stands in the text as sent."""
    word: int
    """The first of the segment's words after it; ``len(words)``: the segment's end."""


@dataclass(frozen=True)
class Segment:
    text: str
    """Normalised: what the voice reads."""
    words: tuple[Word, ...]
    prosody: Prosody = Prosody()
    marks: tuple[SegmentMark, ...] = ()


@dataclass(frozen=True)
class Silence:
    """A pause the text asked for: exact silence, between segments."""

    seconds: float
    marks: tuple[SegmentMark, ...] = ()
    """Marks reached where it starts."""


Planned = Segment | Silence


def make_segment(
    raw: MappedText | str,
    offset: int = 0,
    language: str = "en",
    *,
    spoken: bool = True,
    source: str | None = None,
    budget: WetextBudget | None = None,
) -> Segment:
    """Normalise ``raw`` (text mapped onto what the client sent, ``source``; a string starting at ``offset`` in
    it) and find its words.

    The segmenter applies lexicons before this (so a lexicon says how ``R2-D2`` is read). A word is a
    blank-separated token of the normalised text without its silent edges, mapped back to the client's text;
    tokens that one rewrite produced (``$100`` -> ``one hundred dollars``) are one word."""
    if isinstance(raw, str):
        source = source if source is not None else " " * offset + raw
        raw = MappedText.of(raw, offset)
    if source is None:
        raise TypeError("make_segment needs the source of a mapped text")
    mapped = normalize_mapped(raw.text, language, spoken=spoken, budget=budget).through(raw)
    text = mapped.text.replace("\n", " ")
    words: list[Word] = []
    for start, end in spoken_tokens(text):
        while start < end and text[start] in SILENT_EDGES:
            start += 1
        while end > start and text[end - 1] in SILENT_EDGES:
            end -= 1
        if start == end:
            continue
        source_start, source_end = mapped.source(start, end)
        if words and source_start < words[-1].end:
            last = words.pop()
            source_start, start = last.start, last.spoken_start
            source_end = max(source_end, last.end)
        written = source[source_start:source_end]
        # Words markup made (an alias) map to their element: the words said are what a client can show.
        said = text[start:end] if "<" in written else written
        words.append(Word(said, source_start, source_end, start, end))
    return Segment(text, tuple(words))


class Segmenter:
    """Turns text, whole or in fragments, into segments for synthesis, and the pauses between them.

    ``push`` takes text as it arrives (a few characters at a time from an LLM) and returns the segments that are
    complete; ``flush`` returns the rest of the text pushed so far, ``close`` the rest at the end of input. Text
    is read into its plan first (``engine/ssml.py``: SSML, inline breaks), then cut: at sentences, at a pause, a
    change of prosody or a paragraph. Each segment's words carry their offsets in all the text pushed so far.
    """

    def __init__(
        self,
        first_max_chars: int,
        max_chars: int,
        language: str = "en",
        first_clause_chars: int = 0,
        *,
        spoken: bool = True,
        rules: MarkupRules | None = None,
        lexicons: Sequence[Lexicon] = (),
    ) -> None:
        self.first_max_chars = first_max_chars
        self.max_chars = max_chars
        self.first_clause_chars = first_clause_chars
        """The first segment also ends at its first clause boundary past this many characters (0: it does not)."""
        self.language = language
        self.spoken = spoken
        """Segments are normalised into their spoken form (``SynthesisRequest.normalize``)."""
        self.rules = rules or MarkupRules()
        self.lexicons = tuple(lexicons)
        self.reader = PlanReader(self.rules)
        self.source = ""
        """All the text pushed."""
        self.buffer = MappedText.of("")
        """Speech read and not yet cut into segments."""
        self.prosody = Prosody()
        """The buffer's prosody."""
        self.marks: list[Mark] = []
        """Marks read whose segment is not cut yet."""
        self.emitted = 0
        self.wetext_budget = WetextBudget()
        """The wetext calls all of this text may still make (``engine/spoken.py``)."""

    @classmethod
    def of(
        cls,
        settings: EngineSettings,
        language: str = "en",
        *,
        spoken: bool = True,
        rules: MarkupRules | None = None,
        lexicons: Sequence[Lexicon] = (),
    ) -> Segmenter:
        """The segmenter a stream of ``language`` gets under ``settings``."""
        return cls(
            settings.first_segment_max_chars,
            settings.segment_max_chars,
            language,
            settings.first_segment_clause_chars,
            spoken=spoken,
            rules=rules,
            lexicons=lexicons,
        )

    @property
    def limit(self) -> int:
        return self.first_max_chars if self.emitted == 0 else self.max_chars

    @property
    def ignored(self) -> list[str]:
        """What the text asked for that was not done (``PlanReader.ignored``)."""
        return self.reader.ignored

    def push(self, fragment: str) -> list[Planned]:
        """Segments and pauses complete with ``fragment``; MarkupError for SSML that does not read."""
        self.source += fragment
        return self._plan(self.reader.feed(fragment), final=False)

    def flush(self) -> list[Planned]:
        """The text pushed so far, cut as if it were complete (SSML elements still open stay open)."""
        return self._plan([], final=True)

    def close(self) -> list[Planned]:
        """The rest at the end of input; MarkupError for SSML left unfinished."""
        planned = self._plan(self.reader.close(), final=True)
        if self.marks:  # marks after the last word: reached where the audio ends
            planned.append(Silence(0.0, tuple(SegmentMark(m.name, m.position, 0) for m in self.marks)))
            self.marks = []
        return planned

    def _plan(self, items: list[PlanItem], final: bool) -> list[Planned]:
        planned: list[Planned] = []
        for item in items:
            if isinstance(item, Speech):
                if item.prosody != self.prosody:
                    planned += self._drain(final=True)
                    self.prosody = item.prosody
                self.buffer = MappedText.join([self.buffer, item.text])
            elif isinstance(item, Mark):
                self.marks.append(item)
            elif isinstance(item, Pause):
                planned += self._drain(final=True)
                marks = tuple(SegmentMark(m.name, m.position, 0) for m in self.marks)
                self.marks = []
                if planned and isinstance(planned[-1], Silence) and not marks:  # breaks in a row add up
                    planned[-1] = Silence(planned[-1].seconds + item.seconds, planned[-1].marks)
                else:
                    planned.append(Silence(item.seconds, marks))
            elif isinstance(item, Boundary):
                planned += self._drain(final=True)
        return planned + self._drain(final)

    def _drain(self, final: bool) -> list[Planned]:
        segments: list[Planned] = []
        while True:
            text = self.buffer.text
            end = self._sentence_end(final)
            clause = self._first_clause_end() if self.emitted == 0 else None
            if clause is not None and (end is None or clause < end):
                cut = clause
            elif end is not None and end <= self.limit:
                cut = end
            elif len(text) > self.limit:
                cut = _split_point(text, self.limit)
            elif end is not None or (final and text.strip()):
                cut = len(text)
            else:
                if final and not text.strip():
                    self.buffer = MappedText.of("")
                return segments
            head = self.buffer[:cut]
            self.buffer = self.buffer[cut:]
            self.buffer = self.buffer[len(self.buffer.text) - len(self.buffer.text.lstrip()) :]
            segment = self._segment(head)
            if self._is_speakable(segment.text):
                segments.append(segment)
                self.emitted += 1

    def _segment(self, head: MappedText) -> Segment:
        if self.lexicons:
            head, passed_over = apply_lexicons(head, self.lexicons, self.rules.reads_phonemes)
            if passed_over:
                self.reader.ignore("lexicon pronunciations (this voice takes no phonemes; aliases are used)")
        segment = make_segment(
            head, language=self.language, spoken=self.spoken, source=self.source, budget=self.wetext_budget
        )
        head_end = max((end for _, end in head.spans), default=0)
        marks = [mark for mark in self.marks if mark.position < head_end]
        self.marks = self.marks[len(marks) :]
        placed = tuple(
            SegmentMark(
                mark.name,
                mark.position,
                next((i for i, word in enumerate(segment.words) if word.start >= mark.position), len(segment.words)),
            )
            for mark in marks
        )
        return Segment(segment.text, segment.words, self.prosody, placed)

    def _sentence_end(self, final: bool) -> int | None:
        """End of the first complete sentence in the buffer, if one is known to be complete."""
        text = self.buffer.text
        for match in _SENTENCE_END.finditer(text):
            if match.group(1) and match.group(1).startswith(".") and self._ends_with_abbreviation(match.start()):
                continue
            # A terminator at the very end of a fragment may still grow ("3." -> "3.5"); wait for what follows.
            if match.end() < len(text) or final or text[match.end() - 1].isspace():
                return match.end()
            return None
        return None

    def _first_clause_end(self) -> int | None:
        """End of the buffer's first clause that ends past ``first_clause_chars`` and within the first segment's
        limit, once the blank after its mark has arrived (a comma at a fragment's end may still be "1,000")."""
        if self.first_clause_chars <= 0:
            return None
        for match in _CLAUSE_END.finditer(self.buffer.text):
            if match.end() > self.first_max_chars:
                return None
            if match.end() >= self.first_clause_chars and match.group(1):
                return match.end()
        return None

    def _ends_with_abbreviation(self, dot: int) -> bool:
        if not english_rules(self.language):
            return False
        word = re.search(r"([A-Za-z][A-Za-z.]*)$", self.buffer.text[:dot])
        if word is None:
            return False
        token = word.group(1)
        if len(token) == 1 and token.isupper():
            return True  # an initial, as in "J. R. R. Tolkien"
        return is_abbreviation(token)

    @staticmethod
    def _is_speakable(text: str) -> bool:
        return any(ch.isalnum() for ch in text)


def segment(
    text: str, first_max_chars: int, max_chars: int, language: str = "en", first_clause_chars: int = 0
) -> list[str]:
    """The texts of all segments of a whole text."""
    segmenter = Segmenter(first_max_chars, max_chars, language, first_clause_chars)
    return [piece.text for piece in segmenter.push(text) + segmenter.close() if isinstance(piece, Segment)]


def is_speakable(text: str) -> bool:
    """True when ``text`` has anything a voice can say (its spoken form says nothing more: no need to make it)."""
    return Segmenter._is_speakable(normalize(text, spoken=False))
