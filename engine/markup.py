"""Markup in a request's text, read as it arrives: tags and text, every character mapped to where it was sent.

A tolerant reader for SSML and for the few inline tags plain text may hold (ElevenLabs' and Cartesia's
``<break/>``, Cartesia's ``<speed/>``...), not a general XML parser. It never expands a declared entity, never reads
a DTD or anything external (a document declaring entities, or naming a DTD off w3.org, is refused), and bounds
tags and attributes; so what a hostile document can cost is linear in its length. It repairs what LLMs put into
markup (a bare ``&``, a ``<`` that starts no tag, HTML's named entities) instead of refusing it, because a voice
agent cannot resend a turn; structural errors are the caller's to judge (``engine/ssml.py``).

A ``<`` starts a tag when a name follows it and then ``>``, ``/>`` or an attribute (``name=``, or a bare name
that ends the tag: ``<break strength/>``); anything else after the name (a comma, a word with no ``=``, another
``<``) makes it text, as in ``if a<b then c`` or ``Map<String, Int>``. Once a ``<`` has started a tag, the tag
must be well formed: a bad attribute after that, an attribute twice, or a tag past ``MAX_TAG_CHARS`` is an error.
``List<String>`` is a well-formed tag, so in SSML it opens an element that is never closed: a structural error.

In ``ssml`` mode every tag is markup; in ``plain`` mode only tags named in ``inline_tags`` are, and the rest of
the text, angle brackets and ampersands included, is text as written. Text pushed in pieces is read as it
completes: a tag, comment or entity cut between pieces waits for the rest.
"""

from __future__ import annotations

import html.entities
import re
from dataclasses import dataclass, field
from typing import Literal

from rtvoice.engine.mapped_text import MappedText, Span

MAX_TAG_CHARS = 2048
"""The longest tag read (attributes included): a request's tags are short (the longest a client sends, an
``<audio src>`` with a signed URL, is under 2 KiB); a longer one is an attack or an error. Below the default text
limit (``RTVOICE_MAX_TEXT_CHARS``, 4096), so the reader's own bound is what refuses a long tag."""
MAX_HELD_CHARS = 64
"""In plain text, how long a ``<`` that might still start an inline tag is held before it is read as text."""

_NAME = re.compile(r"[A-Za-z_][\w.\-]*(?::[\w.\-]+)?")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z_:][\w.\-:]*")
_UNQUOTED = re.compile(r"[^\s\"'=<>`/]+")
"""An attribute value as LLMs and HTML write it, without quotes: ``<break time=1s/>``."""
_ENTITY = re.compile(r"&(?:#([0-9]{1,16})|#[xX]([0-9a-fA-F]{1,16})|([A-Za-z][A-Za-z0-9]{0,31}));")
_PARTIAL_ENTITY = re.compile(r"&(?:#[xX]?[0-9a-fA-F]{0,16}|[A-Za-z][A-Za-z0-9]{0,31})?$")
_PREDEFINED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
_W3C_DTD = re.compile(r"https?://(www\.)?w3\.org/", re.IGNORECASE)
_BLANK_RUN = re.compile(r"\s+")


class MarkupError(ValueError):
    """Markup that cannot be read; ``position`` is the offset in the text as sent."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


@dataclass(frozen=True)
class Tag:
    name: str
    """Lower case, with any prefix as written (``amazon:effect``): prefixes are plain names here."""
    attributes: dict[str, str] = field(default_factory=dict)
    """Names in lower case; values with their entities read."""
    start: int = 0
    """Offsets of the whole tag in the text as sent."""
    end: int = 0
    closing: bool = False
    """``</name>``."""
    empty: bool = False
    """``<name/>``."""

    @property
    def span(self) -> Span:
        return self.start, self.end


@dataclass(frozen=True)
class Text:
    text: MappedText
    """Entities read; each character mapped to what it was written as."""


Token = Tag | Text
Mode = Literal["ssml", "plain"]


def decode_entities(text: str, offset: int) -> MappedText:
    """``text`` (which starts at ``offset``) with its character references and named entities read: XML's five,
    numeric ones, and HTML's (LLMs write ``&nbsp;``). A bare ``&`` stays as written, and so does a reference to an
    entity nobody declared (``AT&T;`` is text an LLM wrote; no declaration is ever read, so it names nothing); a
    numeric reference to no character (``&#0;``) says nothing."""
    if "&" not in text:
        return MappedText.of(text, offset)
    parts: list[MappedText] = []
    last = 0
    for match in _ENTITY.finditer(text):
        char = _entity_text(match)
        if char is None:
            continue
        parts.append(MappedText.of(text[last : match.start()], offset + last))
        if char:
            parts.append(MappedText.spanning(char, (offset + match.start(), offset + match.end())))
        last = match.end()
    parts.append(MappedText.of(text[last:], offset + last))
    return MappedText.join(parts)


def _entity_text(match: re.Match[str]) -> str | None:
    """What a reference reads as: its character, "" for a number that is no character, None (kept as written) for
    a name no one declared."""
    decimal, hexadecimal, name = match.groups()
    if name is not None:
        return _PREDEFINED.get(name) or html.entities.html5.get(name + ";")
    code = int(decimal) if decimal is not None else int(hexadecimal, 16)
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return ""
    return chr(code)


class MarkupReader:
    """Tokens of markup text, fed in pieces."""

    def __init__(self, mode: Mode, inline_tags: frozenset[str] = frozenset()) -> None:
        self.mode = mode
        self.inline_tags = inline_tags
        """In plain mode, the (lower-case) tag names that are markup."""
        self._buffer = ""
        self._offset = 0
        """Where ``_buffer`` starts in all the text fed."""

    def feed(self, fragment: str) -> list[Token]:
        self._buffer += fragment
        return self._read(final=False)

    def close(self) -> list[Token]:
        """The rest; MarkupError for a tag, comment or declaration never finished."""
        return self._read(final=True)

    def _read(self, final: bool) -> list[Token]:
        tokens: list[Token] = []
        buffer, position = self._buffer, 0
        text_from = 0
        while position < len(buffer):
            lt = buffer.find("<", position)
            if lt < 0:
                break
            outcome = self._markup_at(buffer, lt, final)
            if outcome is None:  # incomplete: wait for more
                self._emit_text(tokens, buffer[text_from:lt], text_from)
                self._consume(lt)
                return tokens
            end, token = outcome
            if end == lt:  # a "<" that starts no markup: text
                position = lt + 1
                continue
            self._emit_text(tokens, buffer[text_from:lt], text_from)
            if token is not None:
                tokens.append(token)
            text_from = position = end
        tail = buffer[text_from:]
        held = 0
        if not final and self.mode == "ssml":
            partial = _PARTIAL_ENTITY.search(tail)
            held = len(tail) - partial.start() if partial else 0
        self._emit_text(tokens, tail[: len(tail) - held], text_from)
        self._consume(len(buffer) - held)
        return tokens

    def _consume(self, chars: int) -> None:
        self._buffer = self._buffer[chars:]
        self._offset += chars

    def _emit_text(self, tokens: list[Token], text: str, at: int) -> None:
        if not text:
            return
        offset = self._offset + at
        mapped = decode_entities(text, offset) if self.mode == "ssml" else MappedText.of(text, offset)
        tokens.append(Text(mapped))

    def _markup_at(self, buffer: str, lt: int, final: bool) -> tuple[int, Token | None] | None:
        """What starts at ``buffer[lt]`` (a ``<``): (its end, its token or None for a comment or declaration),
        (``lt``, None) for a ``<`` that is text, or None when more text must come to tell."""
        rest = buffer[lt:]
        if self.mode == "plain":
            return self._inline_tag_at(buffer, lt, final)
        if len(rest) < 2:
            return None if not final else (lt, None)
        second = rest[1]
        if second == "!":
            return self._declaration_at(buffer, lt, final)
        if second == "?":
            close = buffer.find("?>", lt + 2)
            if close < 0:
                return self._unfinished(final, "a processing instruction is never closed", lt)
            return close + 2, None
        if second == "/" or second.isalpha() or second == "_":
            return self._tag_at(buffer, lt, final)
        return lt, None

    def _declaration_at(self, buffer: str, lt: int, final: bool) -> tuple[int, Token | None] | None:
        rest = buffer[lt : lt + 9]
        if "<!--".startswith(rest[:4]) and len(rest) < 4 and not final:
            return None
        if rest.startswith("<!--"):
            close = buffer.find("-->", lt + 4)
            if close < 0:
                return self._unfinished(final, "a comment is never closed", lt)
            return close + 3, None
        if "<![CDATA[".startswith(rest) and not final:
            return None
        if rest.startswith("<![CDATA["):
            close = buffer.find("]]>", lt + 9)
            if close < 0:
                return self._unfinished(final, "a CDATA section is never closed", lt)
            body = buffer[lt + 9 : close]
            return close + 3, Text(MappedText.of(body, self._offset + lt + 9))
        if "<!DOCTYPE".startswith(rest.upper()) and not final:
            return None
        if rest.upper().startswith("<!DOCTYPE"):
            return self._doctype_at(buffer, lt, final)
        raise MarkupError(f"markup declaration {rest!r} is not allowed", self._offset + lt)

    def _doctype_at(self, buffer: str, lt: int, final: bool) -> tuple[int, Token | None] | None:
        end = _quoted_end(buffer, lt + 9, "[>")
        if end is None:
            return self._unfinished(final, "the DOCTYPE is never closed", lt)
        if buffer[end] == "[":
            raise MarkupError(
                "a DOCTYPE with declarations (entities, an internal subset) is not allowed", self._offset + lt
            )
        declaration = buffer[lt : end + 1]
        literals = [a or b for a, b in re.findall(r"\"([^\"]*)\"|'([^']*)'", declaration)]
        # PUBLIC "public id" "system id" | SYSTEM "system id": only a system id names a file to read.
        public = re.match(r"<!DOCTYPE\s+\S+\s+PUBLIC\b", declaration, re.IGNORECASE) is not None
        system = literals[1] if public and len(literals) > 1 else (literals[0] if literals and not public else None)
        if system is not None and not _W3C_DTD.match(system):
            raise MarkupError(f"a DOCTYPE naming the DTD {system!r} is not allowed", self._offset + lt)
        return end + 1, None

    def _tag_at(self, buffer: str, lt: int, final: bool) -> tuple[int, Token | None] | None:
        """In SSML: the tag at ``lt``, (``lt``, None) when the ``<`` starts none, None when more text must tell."""
        try:
            tag = _TagScan(buffer, lt, self._offset).scan(final)
        except _NotATag:
            return lt, None
        return None if tag is None else (tag.end - self._offset, tag)

    def _inline_tag_at(self, buffer: str, lt: int, final: bool) -> tuple[int, Token | None] | None:
        """In plain text, a ``<`` is markup only when it starts one of the inline tags, well formed."""
        rest = buffer[lt : lt + MAX_HELD_CHARS]
        match = re.match(r"</?([A-Za-z]*)", rest)
        name = match.group(1).lower() if match else ""
        complete = match is not None and match.end() < len(rest)
        if not complete:  # "<bre" at a piece's end may still be "<break"
            could_be = any(tag.startswith(name) for tag in self.inline_tags)
            return None if could_be and not final and len(rest) < MAX_HELD_CHARS else (lt, None)
        assert match is not None
        if name not in self.inline_tags or rest[match.end()] not in " \t\r\n/>":
            return lt, None
        try:
            tag = _TagScan(buffer, lt, self._offset).scan(final)
        except (_NotATag, MarkupError):
            return lt, None  # not a well-formed tag after all: plain text keeps it as written
        return None if tag is None else (tag.end - self._offset, tag)

    def _unfinished(self, final: bool, message: str, lt: int) -> tuple[int, Token | None] | None:
        """None (wait for the rest) before the end of input; MarkupError at it."""
        if final:
            raise MarkupError(message, self._offset + lt)
        return None


class _NotATag(Exception):
    """The ``<`` starts no tag: it is text."""


class _TagScan:
    """One tag read from its ``<`` at ``buffer[lt]``, a character at a time, so that what follows a name tells
    whether it is a tag at all (see the module's notes). ``scan`` is the tag, None when the buffer ends before that
    is known, ``_NotATag``, or MarkupError for a tag that started and is malformed, never finished, or too long."""

    def __init__(self, buffer: str, lt: int, offset: int) -> None:
        self.buffer = buffer
        self.lt = lt
        self.offset = offset
        """Where ``buffer`` starts in the text as sent."""
        self.limit = min(len(buffer), lt + MAX_TAG_CHARS)
        self.started = False
        """A name and ``>``, ``/>`` or ``=`` seen: from here on, what does not read is an error, not text."""

    def scan(self, final: bool) -> Tag | None:
        try:
            return self._tag()
        except _Cut:
            if len(self.buffer) - self.lt >= MAX_TAG_CHARS:
                raise MarkupError(f"a tag longer than {MAX_TAG_CHARS} characters", self.offset + self.lt) from None
            if not final:
                return None
            if self.started:
                raise MarkupError("a tag is never closed", self.offset + self.lt) from None
            raise _NotATag from None

    def _tag(self) -> Tag:
        buffer = self.buffer
        closing = buffer.startswith("</", self.lt)
        position = self.lt + (2 if closing else 1)
        name_match = _NAME.match(buffer, position, self.limit)
        if name_match is None:
            self._need(position)
            raise _NotATag
        name = name_match.group(0).lower()
        attributes: dict[str, str] = {}
        position = name_match.end()
        while True:
            self._need(position)  # a name may go on in the next piece
            after = self._blanks(position)
            self._need(after)
            char = buffer[after]
            if char == ">" or (char == "/" and not closing):
                end = after if char == ">" else self._blanks(after + 1)
                self._need(end)
                if buffer[end] != ">":
                    self._bad(name, after)
                start = self.offset + self.lt
                return Tag(name, attributes, start, self.offset + end + 1, closing=closing, empty=char == "/")
            if closing or after == position:  # "</b c>", "<String," "<b<": no tag
                self._bad(name, after)
            key_match = _ATTRIBUTE_NAME.match(buffer, after, self.limit)
            if key_match is None:
                self._bad(name, after)
            assert key_match is not None
            equals = self._blanks(key_match.end())
            self._need(equals)
            if buffer[equals] != "=":
                if buffer[equals] == "/":  # "<break strength/>": a tag with a bare attribute, not prose
                    end = self._blanks(equals + 1)
                    self._need(end)
                    self.started = buffer[end] == ">"
                self._bad(name, after)
            self.started = True
            key = key_match.group(0).lower()
            if key in attributes:
                raise MarkupError(f"<{name}> has the attribute {key!r} twice", self.offset + self.lt)
            value_at = self._blanks(equals + 1)
            self._need(value_at)
            quote = buffer[value_at]
            if quote in "\"'":
                close = buffer.find(quote, value_at + 1, self.limit)
                if close < 0:
                    raise _Cut
                value, position = buffer[value_at + 1 : close], close + 1
            else:
                unquoted = _UNQUOTED.match(buffer, value_at, self.limit)
                if unquoted is None:
                    self._bad(name, value_at)
                assert unquoted is not None
                value, position = unquoted.group(0), unquoted.end()
            attributes[key] = _BLANK_RUN.sub(" ", decode_entities(value, 0).text)

    def _blanks(self, position: int) -> int:
        """Where the blanks from ``position`` end."""
        while position < self.limit and self.buffer[position].isspace():
            position += 1
        return position

    def _need(self, position: int) -> None:
        """``_Cut`` when the buffer (or the longest tag) ends at ``position``: what comes next is still to come."""
        if position >= self.limit:
            raise _Cut

    def _bad(self, name: str, at: int) -> None:
        """Text for a ``<`` that had not yet started a tag; an error for a tag that had."""
        if not self.started:
            raise _NotATag
        near = self.buffer[at : min(at + 40, self.limit)].strip()
        raise MarkupError(f"<{name}> has a malformed attribute near {near!r}", self.offset + at)


class _Cut(Exception):
    """The buffer ends inside what may still be a tag."""


_STOP_PATTERNS: dict[str, re.Pattern[str]] = {}


def _quoted_end(buffer: str, start: int, stops: str) -> int | None:
    """Index of the first character of ``stops`` at or after ``start`` outside quotes; None when there is none yet.
    It hops from quote to quote with ``str.find``, so a long tag still costs one pass."""
    pattern = _STOP_PATTERNS.get(stops)
    if pattern is None:
        pattern = _STOP_PATTERNS[stops] = re.compile("[\"'" + re.escape(stops) + "]")
    position = start
    while (match := pattern.search(buffer, position)) is not None:
        char = match.group(0)
        if char in stops:
            return match.start()
        close = buffer.find(char, match.end())
        if close < 0:
            return None
        position = close + 1
    return None
