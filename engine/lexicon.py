"""W3C Pronunciation Lexicon Specification (PLS 1.0) lexicons: how a client says a word should be spoken.

A lexicon maps graphemes (``Nguyen``, ``R2-D2``, ``New York``) to a pronunciation in IPA (or ARPAbet, converted to
IPA) and/or an alias (text spoken instead). :func:`apply_lexicons` rewrites a sentence's :class:`MappedText` before
it is phonemised: with a voice that reads inline phonemes, a word becomes Piper's ``[[ipa]]``; otherwise its alias.

Lexicons come from clients, so the parser is hardened the way defusedxml hardens expat: no DTD internal subset, no
entity declarations, nothing external ever read, and bounds on size, depth and lexemes, so a hostile document costs
at most time linear in its (bounded) length.

Case rules: PLS matches the exact orthography. In addition, a grapheme written all in lower case also matches the
word capitalised (first letter upper: ``tomato`` matches ``Tomato``) and in all capitals (``TOMATO``), since a word
starting a sentence or shouted is the same word; a grapheme with any capital (``US``, ``iPhone``) matches only as
written. An exact form always wins over a derived one (``US`` in one lexicon beats ``us`` upper-cased in another).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.parsers import expat

from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.mapped_text import MappedText

PLS_NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
_XML_LANG = "http://www.w3.org/XML/1998/namespace lang"
_NS_SEPARATOR = " "  # never in a namespace URI or a local name, so "uri local" splits unambiguously

MAX_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_LEXEMES = 10_000
MAX_GRAPHEME_CHARS = 100
"""The longest grapheme: words and short phrases; it also bounds the nesting of the matcher's regex."""

IPA_ALPHABETS = frozenset({"ipa", "x-ipa"})
ARPABET_ALPHABETS = frozenset({"cmu-arpabet", "x-cmu-arpabet", "arpabet", "x-arpabet"})

_TEXT_ELEMENTS = frozenset({"grapheme", "phoneme", "alias"})
_BLANKS = re.compile(r"\s+")
_WORD_CHAR = r"(?:[^\W_]|[\u0300-\u036f])"  # a letter or digit, or a combining mark that belongs to one
_ANY_LANGUAGE = frozenset({"", "mul", "und"})


@dataclass(frozen=True)
class Lexeme:
    graphemes: tuple[str, ...]
    phonemes: str | None
    """The pronunciation in IPA (converted when the lexicon wrote ARPAbet); None when it has none rtvoice can use."""
    alias: str | None
    """Text spoken instead of the grapheme; None when the lexeme has none."""


@dataclass(frozen=True)
class Lexicon:
    language: str
    """The lexicon's ``xml:lang`` (``en-US``); empty when it names none (then it applies to every voice)."""
    lexemes: tuple[Lexeme, ...]
    ignored: int = 0
    """Lexemes dropped because their only pronunciations are in an alphabet rtvoice cannot speak (SAMPA...)."""

    def matcher(self) -> LexiconMatcher:
        """This lexicon's compiled matcher, built on first use and kept on the lexicon: compiling costs about
        0.1 s per 1,000 lexemes, matching a sentence a few microseconds."""
        built: LexiconMatcher | None = self.__dict__.get("_matcher")
        if built is None:
            built = LexiconMatcher.build(self)
            object.__setattr__(self, "_matcher", built)  # a cache, not state: frozen fields stay as they are
        return built


@dataclass(frozen=True)
class _Entry:
    bracketed: str | None
    """``[[ipa]]``, blanks and brackets removed, ready to splice into the text."""
    alias: str | None
    exact: bool
    """Whether the form is the grapheme as written (not capitalised or upper-cased from a lower-case one)."""


@dataclass(frozen=True)
class LexiconMatcher:
    """One regex over every form of a lexicon's graphemes, and what each matched form becomes."""

    pattern: re.Pattern[str] | None
    entries: dict[str, _Entry] = field(repr=False)

    @classmethod
    def build(cls, lexicon: Lexicon) -> LexiconMatcher:
        entries: dict[str, _Entry] = {}
        derived: list[tuple[str, Lexeme]] = []
        for lexeme in lexicon.lexemes:
            for written in lexeme.graphemes:
                # As the parser writes them, for a Lexicon built by hand: an empty form would match everywhere.
                grapheme = _BLANKS.sub(" ", written.strip())
                if not grapheme:
                    continue
                if grapheme not in entries:
                    entries[grapheme] = _entry(lexeme, exact=True)
                if grapheme == grapheme.lower() and grapheme != grapheme.upper():
                    derived.append((grapheme[:1].upper() + grapheme[1:], lexeme))
                    derived.append((grapheme.upper(), lexeme))
        for form, lexeme in derived:  # after every exact form, so a form written that way wins
            if form not in entries:
                entries[form] = _entry(lexeme, exact=False)
        if not entries:
            return cls(None, entries)
        # A trie as a regex: matching costs the depth of the trie per position, not the number of graphemes, and
        # greedy optionals try the longer grapheme first (the lookahead backtracks to a shorter one).
        pattern = re.compile(f"(?<!{_WORD_CHAR})(?:{_trie_pattern(entries)})(?!{_WORD_CHAR})")
        return cls(pattern, entries)

    def entry(self, match: re.Match[str]) -> _Entry:
        found = match.group(0)
        return self.entries.get(found) or self.entries[_BLANKS.sub(" ", found)]


def apply_lexicons(text: MappedText, lexicons: Sequence[Lexicon], phonemes: bool) -> tuple[MappedText, bool]:
    """Replace whole-word matches of the lexicons' graphemes in ``text``.

    With ``phonemes`` (the voice reads Piper's inline ``[[ipa]]``), a lexeme's pronunciation replaces the word;
    otherwise its alias, or nothing changes. Returns the new text (each replacement mapped onto the span of the
    grapheme it replaced) and whether a pronunciation was passed over, so the caller can say it was ignored.

    Scanning left to right, the longest match at a place wins; at equal length an exact form beats a derived one,
    then the earlier lexicon the later. Each lexicon keeps its own compiled regex (one regex for a set would be
    compiled again for every new combination of lexicons a request names, at 0.1 s per 1,000 lexemes)."""
    matchers = [m for m in (lexicon.matcher() for lexicon in lexicons) if m.pattern is not None]
    if not matchers:
        return text, False
    s = text.text
    upcoming: list[re.Match[str] | None] = [m.pattern.search(s) for m in matchers if m.pattern is not None]
    parts: list[MappedText] = []
    passed_over = False
    scanned = 0  # where the next match may start
    copied = 0  # where the text not yet copied into parts starts
    while True:
        best: tuple[tuple[int, int, bool, int], re.Match[str], _Entry] | None = None
        for i, matcher in enumerate(matchers):
            found = upcoming[i]
            if found is not None and found.start() < scanned:  # overlapped by a match taken: look again past it
                assert matcher.pattern is not None
                found = upcoming[i] = matcher.pattern.search(s, scanned)
            if found is None:
                continue
            entry = matcher.entry(found)
            rank = (found.start(), -found.end(), not entry.exact, i)
            if best is None or rank < best[0]:
                best = (rank, found, entry)
        if best is None:
            break
        _, match, entry = best
        scanned = match.end()
        if entry.bracketed is not None and phonemes:
            new = entry.bracketed
        else:
            passed_over = passed_over or entry.bracketed is not None
            if entry.alias is None:
                continue
            new = entry.alias
        parts.append(text[copied : match.start()])
        parts.append(MappedText.spanning(new, text.source(match.start(), match.end())))
        copied = match.end()
    if not parts:
        return text, passed_over
    parts.append(text[copied:])
    return MappedText.join(parts), passed_over


def _entry(lexeme: Lexeme, exact: bool) -> _Entry:
    bracketed = None
    if lexeme.phonemes:
        # Piper's inline phonemes take no blanks inside the brackets, and a bracket would end them early.
        ipa = "".join(ch for ch in lexeme.phonemes if not ch.isspace() and ch not in "[]")
        bracketed = f"[[{ipa}]]" if ipa else None
    return _Entry(bracketed, lexeme.alias, exact)


def _trie_pattern(forms: Iterable[str]) -> str:
    trie: dict[str, Any] = {}
    for form in forms:
        node = trie
        for char in form:
            node = node.setdefault(char, {})
        node[""] = {}  # the end of a form
    return _node_pattern(trie)


def _node_pattern(node: dict[str, Any]) -> str:
    terminal = "" in node
    leaves = sorted(c for c, child in node.items() if c and not c.isspace() and list(child) == [""])
    branches = [_char(c) + _node_pattern(child) for c, child in sorted(node.items()) if c and c not in leaves]
    if leaves:  # forms ending here share one character class: fewer alternatives to try
        branches.append(re.escape(leaves[0]) if len(leaves) == 1 else f"[{''.join(map(re.escape, leaves))}]")
    if not branches:
        return ""
    if len(branches) == 1 and not terminal:
        return branches[0]
    return f"(?:{'|'.join(branches)})" + ("?" if terminal else "")


def _char(char: str) -> str:
    return r"\s+" if char == " " else re.escape(char)


def lexicon_applies(lexicon: Lexicon, voice_language: str) -> bool:
    """Whether a lexicon applies to a voice: one with no language to every voice; otherwise when the primary
    subtags match (``en-US`` applies to ``en_US``, ``en-GB`` and ``en``); a voice of ``mul`` takes every one."""
    voice = _primary(voice_language)
    return not lexicon.language or voice in _ANY_LANGUAGE or _primary(lexicon.language) == voice


def _primary(language: str) -> str:
    return language.strip().replace("_", "-").partition("-")[0].lower()


def parse_pls(
    data: bytes | str,
    source: str = "lexicon",
    *,
    param: str = "lexicon",
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_lexemes: int = MAX_LEXEMES,
) -> Lexicon:
    """Read a PLS 1.0 document; raises :class:`InvalidRequest` (code ``invalid_lexicon``) naming the problem and
    where it is. ``source`` names the document in messages (an upload's file name, a startup file's path)."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise InvalidRequest(
            f"{source} is {size} bytes; a lexicon may be at most {max_bytes}", code="invalid_lexicon", param=param
        )
    return _PlsReader(source, param, max_depth, max_lexemes).read(data)


class _LexemeBuilder:
    def __init__(self, line: int, column: int) -> None:
        self.where = f"line {line}, column {column}"
        self.graphemes: list[str] = []
        self.phonemes: list[tuple[str, bool]] = []
        self.aliases: list[tuple[str, bool]] = []
        self.pronunciations = 0  # phonemes and aliases written, usable or not


class _PlsReader:
    def __init__(self, source: str, param: str, max_depth: int, max_lexemes: int) -> None:
        self.source = source
        self.param = param
        self.max_depth = max_depth
        self.max_lexemes = max_lexemes
        self.parser = expat.ParserCreate(namespace_separator=_NS_SEPARATOR)
        self.stack: list[str] = []
        self.ignore_depth = 0  # > 0 inside an element rtvoice does not read (metadata, another namespace)
        self.alphabet = ""
        self.language = ""
        self.lexemes: list[Lexeme] = []
        self.lexeme_count = 0
        self.ignored = 0
        self.lexeme: _LexemeBuilder | None = None
        self.text: list[str] | None = None
        self.text_attributes: dict[str, str] = {}
        self.text_where = ""

    def read(self, data: bytes | str) -> Lexicon:
        p = self.parser
        # Hardened as defusedxml does: external entities and DTDs are never fetched, and any declaration (the
        # only way to an entity expansion bomb) is refused outright.
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartDoctypeDeclHandler = self._doctype
        p.EntityDeclHandler = self._entity
        p.UnparsedEntityDeclHandler = self._unparsed_entity
        p.ExternalEntityRefHandler = self._external_entity
        p.StartElementHandler = self._start
        p.EndElementHandler = self._end
        p.CharacterDataHandler = self._characters
        p.buffer_text = True
        try:
            p.Parse(data, True)
        except expat.ExpatError as error:
            raise InvalidRequest(
                f"{self.source} is not well-formed XML: {expat.ErrorString(error.code)} "
                f"at line {error.lineno}, column {error.offset + 1}",
                code="invalid_lexicon",
                param=self.param,
            ) from None
        return Lexicon(self.language, tuple(self.lexemes), self.ignored)

    def _error(self, problem: str, where: str | None = None) -> InvalidRequest:
        if where is None:
            where = f"line {self.parser.CurrentLineNumber}, column {self.parser.CurrentColumnNumber + 1}"
        return InvalidRequest(f"{self.source}: {problem} at {where}", code="invalid_lexicon", param=self.param)

    def _doctype(self, name: str, system_id: str | None, public_id: str | None, has_internal_subset: bool) -> None:
        if has_internal_subset:
            raise self._error("a DOCTYPE with an internal subset (declarations) is not accepted")

    def _entity(self, name: str, *args: object) -> None:
        raise self._error(f"entity declarations are not accepted (entity {name!r})")

    def _unparsed_entity(self, name: str, *args: object) -> None:
        raise self._error(f"entity declarations are not accepted (unparsed entity {name!r})")

    def _external_entity(self, *args: object) -> int:
        raise self._error("external entities are not read")

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        if len(self.stack) >= self.max_depth:
            raise self._error(f"elements nest deeper than {self.max_depth}")
        namespace, _, local = name.rpartition(_NS_SEPARATOR)
        parent = self.stack[-1] if self.stack else None
        self.stack.append(local)
        if self.ignore_depth:
            self.ignore_depth += 1
            return
        if namespace not in ("", PLS_NAMESPACE):
            if parent is None:
                raise self._error(f"the root element is in namespace {namespace!r}, not PLS's {PLS_NAMESPACE!r}")
            self.ignore_depth = 1  # foreign markup (PLS allows metadata in any namespace): not ours to read
            return
        if parent is None:
            if local != "lexicon":
                raise self._error(f"the root element is <{local}>, not <lexicon>")
            self.alphabet = attributes.get("alphabet", "").strip().lower()
            self.language = attributes.get(_XML_LANG, "").strip()
            return
        if self.text is not None:
            raise self._error(f"<{local}> inside <{parent}>, which holds text only")
        if local == "lexeme":
            if parent != "lexicon":
                raise self._error(f"<lexeme> inside <{parent}>; lexemes belong directly in <lexicon>")
            self.lexeme_count += 1
            if self.lexeme_count > self.max_lexemes:
                raise self._error(f"more than {self.max_lexemes} lexemes")
            self.lexeme = _LexemeBuilder(self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1)
        elif local in _TEXT_ELEMENTS:
            if parent != "lexeme":
                raise self._error(f"<{local}> outside a <lexeme>")
            self.text = []
            self.text_attributes = attributes
            self.text_where = f"line {self.parser.CurrentLineNumber}, column {self.parser.CurrentColumnNumber + 1}"
        else:
            self.ignore_depth = 1  # <meta>, <metadata>, <example>: nothing to speak

    def _characters(self, data: str) -> None:
        if self.text is not None and not self.ignore_depth:
            self.text.append(data)

    def _end(self, name: str) -> None:
        local = self.stack.pop()
        if self.ignore_depth:
            self.ignore_depth -= 1
            return
        if local in _TEXT_ELEMENTS and self.text is not None:
            self._text_element(local, unicodedata.normalize("NFC", _BLANKS.sub(" ", "".join(self.text)).strip()))
            self.text = None
        elif local == "lexeme" and self.lexeme is not None:
            self._finish_lexeme(self.lexeme)
            self.lexeme = None

    def _text_element(self, local: str, text: str) -> None:
        lexeme = self.lexeme
        assert lexeme is not None  # a text element is only read inside a lexeme
        where = self.text_where
        if not text:
            raise self._error(f"an empty <{local}>", where)
        prefer = self.text_attributes.get("prefer", "").strip().lower() == "true"
        if local == "grapheme":
            if len(text) > MAX_GRAPHEME_CHARS:
                raise self._error(f"a grapheme longer than {MAX_GRAPHEME_CHARS} characters", where)
            if text not in lexeme.graphemes:
                lexeme.graphemes.append(text)
        elif local == "alias":
            lexeme.pronunciations += 1
            # Brackets removed: an alias is text to speak, never a way to splice phonemes into it.
            lexeme.aliases.append((text.replace("[", "").replace("]", ""), prefer))
        else:
            lexeme.pronunciations += 1
            ipa = self._ipa(text, self.text_attributes.get("alphabet", "").strip().lower() or self.alphabet, where)
            if ipa:
                lexeme.phonemes.append((ipa, prefer))

    def _ipa(self, text: str, alphabet: str, where: str) -> str | None:
        if not alphabet:
            raise self._error("a <phoneme> with no alphabet (neither it nor <lexicon> names one)", where)
        if alphabet in IPA_ALPHABETS:
            return text
        if alphabet in ARPABET_ALPHABETS:
            # Imported here: the converter is needed only by ARPAbet lexicons.
            from rtvoice.engine.arpabet import arpabet_to_ipa

            try:
                return arpabet_to_ipa(text).strip() or None
            except (ValueError, KeyError) as error:
                raise self._error(f"ARPAbet {text!r} cannot be read ({error})", where) from None
        return None  # an alphabet rtvoice cannot speak: the lexeme keeps its alias, if any

    def _finish_lexeme(self, lexeme: _LexemeBuilder) -> None:
        if not lexeme.graphemes:
            raise self._error("a <lexeme> with no <grapheme>", lexeme.where)
        if not lexeme.pronunciations:
            raise self._error("a <lexeme> with neither <phoneme> nor <alias>", lexeme.where)
        phonemes = _chosen(lexeme.phonemes)
        alias = _chosen(lexeme.aliases)
        if phonemes is None and alias is None:
            self.ignored += 1
            return
        self.lexemes.append(Lexeme(tuple(lexeme.graphemes), phonemes, alias))


def _chosen(candidates: list[tuple[str, bool]]) -> str | None:
    """PLS's choice among pronunciations: the first marked ``prefer="true"``, else the first."""
    for text, prefer in candidates:
        if prefer:
            return text
    return candidates[0][0] if candidates else None
