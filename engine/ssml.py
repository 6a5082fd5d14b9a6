"""A request's text into its plan: SSML, or plain text with the inline tags clients put into it.

Text whose first significant content is ``<speak`` (after blanks, an XML declaration, a DOCTYPE, comments) is SSML,
unless the request says what its text is. SSML is read as the subset of SSML 1.1 a voice agent uses, in the forms
vendors' clients send it (Amazon's, Azure's and Google's prefixed elements are unknown elements, whose text is
spoken; names match in any case); plain text is text, except for ``<break/>`` (ElevenLabs, Cartesia) and, on
Cartesia's routes, Cartesia's own tags. What a voice cannot do (a phoneme on a voice without phoneme input) falls back
to the element's text and is reported in ``PlanReader.ignored``.

The table of what each element does is the README's "SSML" section; values' readings (break strengths, rate and
volume keywords) and the reasons for them are in ``docs/decisions.md``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Literal

from rtvoice.engine import say_as as say_as_module
from rtvoice.engine.arpabet import arpabet_to_ipa
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.mapped_text import MappedText, Span
from rtvoice.engine.markup import MarkupError, MarkupReader, Mode, Tag, Text, Token
from rtvoice.engine.models.base import MAX_SPEED, MIN_SPEED
from rtvoice.engine.plan import Boundary, Mark, Pause, PlanItem, Prosody, Speech

__all__ = ["MarkupError", "MarkupRules", "PlanReader", "invalid_ssml", "read_plan"]

TextType = Literal["auto", "ssml", "text"]
InlineTags = Literal["break", "cartesia"]

MAX_DEPTH = 32
"""Elements nested deeper than this are an attack, not speech."""
MAX_GAIN = 4.0
"""+12 dB: louder only clips."""

BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25}
RATE_KEYWORDS = {"x-slow": 0.5, "slow": 0.64, "medium": 1.0, "default": 1.0, "fast": 1.55, "x-fast": 2.0}
VOLUME_DB = {"x-soft": -12.0, "soft": -6.0, "medium": 0.0, "default": 0.0, "loud": 6.0, "x-loud": 10.0}

_INLINE_TAGS: dict[str, frozenset[str]] = {
    "break": frozenset({"break"}),
    "cartesia": frozenset({"break", "emotion", "speed", "volume", "spell"}),
}
_ATOMIC = frozenset({"sub", "say-as", "phoneme", "spell"})
"""Elements whose content is read whole when they close."""
_STRUCTURE = frozenset({"p", "s", "paragraph", "sentence"})
_ACCEPTED = frozenset({"speak", "emphasis", "lang", "prosody", "audio", "desc", *_STRUCTURE, *_ATOMIC})
_TIME = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*$", re.IGNORECASE)
_RELATIVE = re.compile(r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*(%|db)?\s*$", re.IGNORECASE)
_SPEAK_ROOT = re.compile(r"<speak[\s/>]", re.IGNORECASE)
_PROLOG = re.compile(r"[\s\ufeff]+|<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>\[]*>", re.DOTALL | re.IGNORECASE)
"""What may come before the root: blanks (a byte order mark too), an XML declaration, comments, a DOCTYPE."""
_PROLOG_STARTS = ("<speak", "<?", "<!--", "<!doctype")
_MARKDOWN = re.compile(r"\*{1,3}|_{2,3}|(?<=\n)[ \t]*[*+](?=[ \t])|^[ \t]*[*+](?=[ \t])")
"""Markdown's emphasis marks and list bullets, which LLMs write into SSML."""
BARE_SECONDS_BELOW = 100.0
"""A break time without a unit below this is seconds (``2``), from it milliseconds (``500``)."""


@dataclass(frozen=True)
class MarkupRules:
    """How a request's text is read, and what its voice can do with it."""

    text_type: TextType = "auto"
    """``auto``: SSML when it starts with ``<speak``; ``ssml`` or ``text`` force it either way."""
    inline_tags: InlineTags = "break"
    """The tags plain text may hold: ``<break/>`` everywhere, Cartesia's tags on Cartesia's routes."""
    reads_phonemes: bool = False
    """The voice takes IPA phonemes (Piper's ``[[ ]]`` input)."""
    max_break_s: float = 10.0
    """Longest silence one break makes (Polly's cap)."""
    max_silence_s: float = 60.0
    """Longest silence all of a request's breaks make together."""


def detect(text: str, final: bool) -> Mode | None:
    """``ssml`` when the first significant content of ``text`` is a ``<speak`` tag, ``plain`` when it is anything
    else, None when ``text`` is too short to tell yet."""
    position = 0
    while position < len(text):
        match = _PROLOG.match(text, position)
        if match is None or match.end() == position:
            break
        position = match.end()
    rest = text[position:]
    # A DOCTYPE with declarations is XML that the SSML reader must refuse, not text to read aloud.
    if _SPEAK_ROOT.match(rest) or rest[:9].upper() == "<!DOCTYPE":
        return "ssml"
    if not final and _may_still_be_ssml(rest):
        return None
    return "plain"


def _may_still_be_ssml(rest: str) -> bool:
    """``rest`` is the start of ``<speak``, or of a declaration, comment or DOCTYPE not yet closed."""
    head = rest[:9].lower()
    return any(start.startswith(head[: len(start)]) or head.startswith(start) for start in _PROLOG_STARTS)


class MarkdownFilter:
    """Takes Markdown's emphasis marks (``**``, ``*``, ``__``) and list bullets out of SSML's text as it comes.

    A mark goes when it touches a word on one side only (it opens or closes emphasis: ``**very**,``); one between
    blanks (``5 * 3``) or inside a word (``a*b``) stays. Text arrives in pieces and around tags, so the last
    character read is kept for the next piece, and a mark at a piece's end waits for the character after it."""

    def __init__(self) -> None:
        self._before = "\n"
        self._held: MappedText | None = None

    def strip(self, text: MappedText, final: bool, next_char: str | None = None) -> MappedText:
        """``text`` (after what is held) without its marks; with ``final``, what is held is judged against
        ``next_char`` (None: the end)."""
        if self._held is not None:
            text = MappedText.join([self._held, text])
            self._held = None
        if not final:  # marks and bullets at a piece's end are judged once the next character is known
            held = len(text.text) - len(text.text.rstrip("*_+"))
            if held:
                self._held, text = text[len(text.text) - held :], text[: len(text.text) - held]
        if not text.text:
            return text
        keep: list[MappedText] = []
        copied = 0
        for match in _MARKDOWN.finditer(text.text):
            start, end = match.span()
            before = text.text[start - 1] if start else self._before
            after = text.text[end] if end < len(text.text) else next_char
            bullet = match.group(0).strip() in ("*", "+") and before == "\n" and after is not None and after in " \t"
            if bullet or _touches_one_side(before, after):
                keep.append(text[copied:start])
                copied = end
        keep.append(text[copied:])
        kept = MappedText.join(keep)
        if kept.text:
            self._before = kept.text[-1]
        return kept


def _touches_one_side(before: str, after: str | None) -> bool:
    """A mark with a word on one side and a blank, punctuation or the end on the other."""
    return before.isalnum() != (after is not None and after.isalnum())


@dataclass
class _Open:
    """An element being read."""

    name: str
    start: int
    prosody: Prosody
    collecting: list[MappedText] | None = None
    """The text of an element read whole (``sub``, ``say-as``...)."""
    tag: Tag | None = None
    silent: bool = False
    """Its text is never spoken (``<desc>``)."""


@dataclass
class PlanReader:
    """A request's text, whole or in pieces, into plan items."""

    rules: MarkupRules = field(default_factory=MarkupRules)
    ignored: list[str] = field(default_factory=list)
    """What the text asked for that its voice does not do, or this server does not know, in order, once each."""
    mode: Mode | None = None
    """``ssml`` or ``plain`` once known."""
    _waiting: str = ""
    _reader: MarkupReader | None = None
    _stack: list[_Open] = field(default_factory=list)
    _root_closed: bool = False
    _silence_s: float = 0.0
    _prosody: Prosody = Prosody()
    """Plain text's prosody (Cartesia's ``<speed/>`` and ``<volume/>`` last until the next)."""
    _markdown: MarkdownFilter = field(default_factory=lambda: MarkdownFilter())
    """SSML's text without the Markdown an LLM wrote into it."""

    def __post_init__(self) -> None:
        if self.rules.text_type != "auto":
            self._start("ssml" if self.rules.text_type == "ssml" else "plain")

    def feed(self, fragment: str) -> list[PlanItem]:
        if self._reader is None:
            self._waiting += fragment
            mode = detect(self._waiting, final=False)
            if mode is None:
                return []
            self._start(mode)
            fragment, self._waiting = self._waiting, ""
        assert self._reader is not None
        return self._items(self._reader.feed(fragment))

    def close(self) -> list[PlanItem]:
        """The rest of the plan; MarkupError for SSML left unfinished (an element never closed)."""
        items: list[PlanItem] = []
        if self._reader is None:
            self._start(detect(self._waiting, final=True) or "plain")
            assert self._reader is not None
            items += self._items(self._reader.feed(self._waiting))
            self._waiting = ""
        assert self._reader is not None
        items += self._items(self._reader.close())
        if self.mode == "ssml":
            held = self._markdown.strip(MappedText.of(""), final=True)
            items += [Speech(held, self._current)] if held.text else []
        if self._stack:
            if self.mode == "ssml":
                open_element = self._stack[-1]
                raise MarkupError(f"<{open_element.name}> is never closed", open_element.start)
            items += self._close_inline_spell(self._reader_end())
        return items

    def _start(self, mode: Mode) -> None:
        self.mode = mode
        inline = _INLINE_TAGS[self.rules.inline_tags] if mode == "plain" else frozenset()
        self._reader = MarkupReader(mode, inline)

    def _reader_end(self) -> int:
        return self._stack[-1].start if self._stack else 0

    def ignore(self, what: str) -> None:
        if what not in self.ignored:
            self.ignored.append(what)

    # -- tokens into items ------------------------------------------------------------------------

    def _items(self, tokens: list[Token]) -> list[PlanItem]:
        items: list[PlanItem] = []
        for token in tokens:
            if self.mode == "ssml":
                items += self._ssml(token)
            else:
                items += self._plain(token)
        return items

    @property
    def _current(self) -> Prosody:
        return self._stack[-1].prosody if self._stack else self._prosody

    def _ssml(self, token: Token) -> list[PlanItem]:
        if isinstance(token, Text):
            return self._text(token.text)
        tag = token
        if self._root_closed:
            raise MarkupError(f"<{tag.name}> after the document's root element ended", tag.start)
        held = self._markdown.strip(MappedText.of(""), final=True, next_char="<")
        items: list[PlanItem] = [Speech(held, self._current)] if held.text else []
        return items + self._tag(tag)

    def _tag(self, tag: Tag) -> list[PlanItem]:
        if tag.closing:
            return self._end(tag)
        if self._stack and self._stack[-1].collecting is not None:  # inside an element read whole: text only
            if tag.name not in ("break", "mark"):
                self.ignore(f"<{tag.name}> inside <{self._stack[-1].name}>")
            if not tag.empty:
                self._push(_Open(tag.name, tag.start, self._current, collecting=self._stack[-1].collecting))
            return []
        items = self._element(tag)
        if not tag.empty:
            prosody = self._prosody_of(tag) if tag.name == "prosody" else self._current
            collecting: list[MappedText] | None = [] if tag.name in _ATOMIC else None
            silent = tag.name == "desc" or bool(self._stack and self._stack[-1].silent)
            self._push(_Open(tag.name, tag.start, prosody, collecting, tag, silent))
        elif tag.name in _ATOMIC:
            items += self._whole(tag, _Open(tag.name, tag.start, self._current, [], tag), tag.end)
        return items

    def _push(self, element: _Open) -> None:
        if len(self._stack) >= MAX_DEPTH:
            raise MarkupError(f"elements nested deeper than {MAX_DEPTH}", element.start)
        self._stack.append(element)

    def _element(self, tag: Tag) -> list[PlanItem]:
        """What an element's start (or an empty element) asks for, besides its content."""
        name = tag.name
        if name == "break":
            return self._break(tag)
        if name in ("mark", "bookmark"):
            mark = tag.attributes.get("name" if name == "mark" else "mark")
            if mark is None:
                self.ignore(f"<{name}> without a name")
                return []
            return [Mark(mark, tag.start)]
        if name == "speak" and self._stack:
            raise MarkupError("<speak> inside <speak>", tag.start)
        if name in _STRUCTURE:
            return [Boundary(tag.start)]
        if name == "audio":
            self.ignore("<audio> (its text is spoken instead)")
        elif name not in _ACCEPTED:
            self.ignore(f"<{name}>")
        return []

    def _end(self, tag: Tag) -> list[PlanItem]:
        if not self._stack:
            raise MarkupError(f"</{tag.name}> closes no element", tag.start)
        element = self._stack[-1]
        if element.name != tag.name:
            raise MarkupError(f"</{tag.name}> closes <{element.name}> (opened at {element.start})", tag.start)
        self._stack.pop()
        if element.name == "speak" and not self._stack:
            self._root_closed = True
        if element.tag is not None and element.collecting is not None and element.name in _ATOMIC:
            if not self._stack or self._stack[-1].collecting is not element.collecting:
                return self._whole(element.tag, element, tag.end)
        if element.name in _STRUCTURE:
            return [Boundary(tag.end)]
        return []

    def _text(self, text: MappedText) -> list[PlanItem]:
        if self._stack and self._stack[-1].collecting is not None:
            self._stack[-1].collecting.append(text)
            return []
        if self._stack and self._stack[-1].silent:
            return []
        if not self._stack:
            if not text.text.replace("\ufeff", "").strip():
                return []
            if self._root_closed:
                raise MarkupError("text after the document's root element ended", text.spans[0][0])
        text = self._markdown.strip(text, final=False)
        return [Speech(text, self._current)] if text.text else []

    # -- elements read whole --------------------------------------------------------------------

    def _whole(self, tag: Tag, element: _Open, end: int) -> list[PlanItem]:
        """``sub``, ``say-as``, ``phoneme`` and Cartesia's ``spell``, once all their text is there."""
        content = MappedText.join(element.collecting or [])
        span: Span = (tag.start, end)
        spoken = self._whole_text(tag, content, span)
        return [Speech(spoken, element.prosody)] if spoken.text.strip() else []

    def _whole_text(self, tag: Tag, content: MappedText, span: Span) -> MappedText:
        attributes = tag.attributes
        if tag.name == "sub":
            alias = attributes.get("alias")
            if alias is None:
                self.ignore("<sub> without an alias")
                return content
            return MappedText.spanning(alias, span)
        if tag.name == "phoneme":
            return self._phonemes(attributes, content)
        kind = "characters" if tag.name == "spell" else attributes.get("interpret-as", "")
        pieces = say_as_module.say_as(content.text, kind, attributes.get("format"), attributes.get("detail"))
        if pieces is None:
            self.ignore(f'<say-as interpret-as="{kind}">')
            return content
        parts: list[MappedText] = []
        for words, (start, end) in pieces:
            if parts:
                parts.append(MappedText.spanning(" ", span))
            parts.append(MappedText.spanning(words, content.source(start, end)))
        return MappedText.join(parts)

    def _phonemes(self, attributes: dict[str, str], content: MappedText) -> MappedText:
        alphabet = attributes.get("alphabet", "ipa").lower()
        phonemes = attributes.get("ph", "")
        if not self.rules.reads_phonemes:
            self.ignore("<phoneme> (this voice takes no phonemes; its text is spoken)")
            return content
        if alphabet in ("cmu-arpabet", "x-cmu-arpabet", "arpabet"):
            try:
                phonemes = arpabet_to_ipa(phonemes)
            except ValueError:
                self.ignore(f'<phoneme alphabet="{alphabet}"> with unknown symbols')
                return content
        elif alphabet not in ("ipa", "x-ipa"):
            self.ignore(f'<phoneme alphabet="{alphabet}">')
            return content
        phonemes = re.sub(r"[\s\[\]]+", "", phonemes)
        if not phonemes or not content.text.strip():
            return content
        # Piper's inline phoneme syntax; its characters map to the word it is said for.
        stripped = content.strip()
        return MappedText.spanning(f"[[{phonemes}]]", stripped.source(0, len(stripped)))

    # -- values -----------------------------------------------------------------------------------

    def _break(self, tag: Tag) -> list[PlanItem]:
        seconds: float | None = None
        time = tag.attributes.get("time")
        if time is not None:
            seconds = self._seconds(time)
            if seconds is None:
                self.ignore(f'<break time="{time[:20]}">')
        strength = tag.attributes.get("strength")
        if seconds is None and strength is not None:
            seconds = BREAK_STRENGTHS.get(strength.strip().lower())
            if seconds is None:
                self.ignore(f'<break strength="{strength[:20]}">')
        if seconds is None:
            seconds = BREAK_STRENGTHS["medium"]
        if seconds > self.rules.max_break_s:
            self.ignore(f"breaks past {self.rules.max_break_s:g} s (each is cut to that)")
            seconds = self.rules.max_break_s
        room = max(0.0, self.rules.max_silence_s - self._silence_s)
        if seconds > room:
            self.ignore(f"breaks past {self.rules.max_silence_s:g} s in all")
            seconds = room
        self._silence_s += seconds
        if seconds <= 0:  # no pause, but still between words
            return [Speech(MappedText.spanning(" ", tag.span), self._current)]
        return [Pause(seconds, tag.start)]

    def _seconds(self, value: str) -> float | None:
        """A break's time: ``500ms``, ``1.5s``; a bare number is seconds below ``BARE_SECONDS_BELOW``, else
        milliseconds (``2`` is two seconds, ``500`` half of one)."""
        match = _TIME.match(value)
        if match is None:
            return None
        number, unit = float(match.group(1)), (match.group(2) or "").lower()
        if unit == "ms" or (not unit and number >= BARE_SECONDS_BELOW):
            number /= 1000
        return number if math.isfinite(number) else None

    def _prosody_of(self, tag: Tag) -> Prosody:
        prosody = self._current
        attributes = tag.attributes
        if "rate" in attributes:
            rate = _rate(attributes["rate"], prosody.rate)
            if rate is None:
                self.ignore(f'<prosody rate="{attributes["rate"][:20]}">')
            else:
                prosody = replace(prosody, rate=rate)
        if "volume" in attributes:
            volume = _volume(attributes["volume"], prosody.volume)
            if volume is None:
                self.ignore(f'<prosody volume="{attributes["volume"][:20]}">')
            else:
                prosody = replace(prosody, volume=volume)
        for ignored in ("pitch", "contour", "range", "duration"):
            if ignored in attributes:
                self.ignore(f"<prosody {ignored}>")
        return prosody

    # -- plain text -------------------------------------------------------------------------------

    def _plain(self, token: Token) -> list[PlanItem]:
        if isinstance(token, Text):
            if self._stack:  # inside Cartesia's <spell>
                collecting = self._stack[-1].collecting
                assert collecting is not None
                collecting.append(token.text)
                return []
            return [Speech(token.text, self._prosody)]
        tag = token
        if tag.name == "break":
            return [] if tag.closing else self._break(tag)
        if tag.name == "spell":
            if tag.closing:
                return self._close_inline_spell(tag.end)
            if not self._stack and not tag.empty:
                self._stack.append(_Open("spell", tag.start, self._prosody, [], tag))
            return []
        if tag.name == "speed" and not tag.closing:
            rate = _ratio(tag.attributes.get("ratio"), MIN_SPEED, MAX_SPEED)
            if rate is None:
                self.ignore('<speed ratio="…">')
            else:
                self._prosody = replace(self._prosody, rate=rate)
        if tag.name == "volume" and not tag.closing:
            volume = _ratio(tag.attributes.get("ratio"), 0.0, MAX_GAIN)
            if volume is None:
                self.ignore('<volume ratio="…">')
            else:
                self._prosody = replace(self._prosody, volume=volume)
        return []  # <emotion/> is never read; this server has no emotions to give it

    def _close_inline_spell(self, end: int) -> list[PlanItem]:
        if not self._stack:
            return []
        element = self._stack.pop()
        assert element.tag is not None
        return self._whole(element.tag, element, end)


def _rate(value: str, parent: float) -> float | None:
    """``prosody rate``: a keyword (of the voice's default), a percentage, a signed change or a bare multiplier
    (of the rate around it), kept within the speed bounds."""
    keyword = RATE_KEYWORDS.get(value.strip().lower())
    if keyword is not None:
        return keyword
    match = _RELATIVE.match(value)
    if match is None or (match.group(3) or "").lower() == "db":
        return None
    sign, number, unit = match.group(1), float(match.group(2)), match.group(3)
    if unit:
        factor = 1 + (number if sign != "-" else -number) / 100 if sign else number / 100
    else:
        factor = number if not sign else 1 + (number if sign == "+" else -number)
    if not math.isfinite(factor) or factor <= 0:
        return None
    return min(MAX_SPEED, max(MIN_SPEED, parent * factor))


def _volume(value: str, parent: float) -> float | None:
    """``prosody volume`` as a gain: a keyword, a change in dB or per cent, or Azure's absolute 0–100."""
    text = value.strip().lower()
    if text == "silent":
        return 0.0
    if text in VOLUME_DB:
        return min(MAX_GAIN, 10 ** (VOLUME_DB[text] / 20))
    match = _RELATIVE.match(text)
    if match is None:
        return None
    sign, number, unit = match.group(1), float(match.group(2)), (match.group(3) or "").lower()
    signed = -number if sign == "-" else number
    if unit == "db":
        gain = parent * 10 ** (signed / 20)
    elif unit == "%":
        gain = parent * (1 + signed / 100) if sign else parent * number / 100
    else:
        gain = number / 100 if not sign else parent * (1 + signed / 100)
    return min(MAX_GAIN, max(0.0, gain)) if math.isfinite(gain) else None


def _ratio(value: str | None, low: float, high: float) -> float | None:
    """Cartesia's ``ratio``: a multiplier, kept within bounds."""
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return min(high, max(low, number)) if math.isfinite(number) and number >= 0 else None


def invalid_ssml(error: MarkupError, param: str) -> InvalidRequest:
    """The client's error for markup that does not read: what and where, in the text as sent."""
    return InvalidRequest(
        f"invalid SSML at character {error.position}: {error.message}", code="invalid_ssml", param=param
    )


def read_plan(text: str, rules: MarkupRules | None = None) -> tuple[list[PlanItem], list[str]]:
    """A whole text's plan, and what it asked for that was ignored; MarkupError when it does not read."""
    reader = PlanReader(rules or MarkupRules())
    items = reader.feed(text) + reader.close()
    return items, reader.ignored
