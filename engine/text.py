"""Text normalisation and segmentation.

Segments are what a model synthesises in one pass: sentences, and clauses of
sentences too long to wait for. The first segment of a stream is kept short
because its length sets the time to first audio; later ones are synthesised
while earlier audio plays.
"""

from __future__ import annotations

import re
import unicodedata

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200b\u3000]+")
_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": ", ", "\u2014": ", ", "\u2026": "...",
})

_ENGLISH_ABBREVIATIONS = {
    "mr": "Mister", "mrs": "Missus", "ms": "Miz", "dr": "Doctor", "prof": "Professor", "st": "Saint",
    "jr": "Junior", "sr": "Senior", "vs": "versus", "etc": "etcetera", "approx": "approximately",
    "dept": "department", "mt": "Mount", "no": "number", "jan": "January", "feb": "February",
    "mar": "March", "apr": "April", "jun": "June", "jul": "July", "aug": "August", "sep": "September",
    "sept": "September", "oct": "October", "nov": "November", "dec": "December",
}
# "No." is only an abbreviation before a number ("No. 5"); "etc." may end a sentence.
_ABBREVIATION = re.compile(r"\b(" + "|".join(k for k in _ENGLISH_ABBREVIATIONS if k != "no") + r")\.(?=\s|$)",
                           re.IGNORECASE)
_NUMBER_ABBREVIATION = re.compile(r"\bno\.(?=\s*\d)", re.IGNORECASE)
_LATIN = {"e.g.": "for example", "i.e.": "that is", "a.m.": "A M", "p.m.": "P M"}
_LATIN_PATTERN = re.compile(r"\b(" + "|".join(re.escape(k) for k in _LATIN) + r")(?=\W|$)", re.IGNORECASE)
_CURRENCY = {"$": ("dollar", "dollars", "cent", "cents"), "\u00a3": ("pound", "pounds", "penny", "pence"),
             "\u20ac": ("euro", "euros", "cent", "cents")}
_MONEY = re.compile(r"([$\u00a3\u20ac])\s?(\d[\d,]*)(?:\.(\d{1,2}))?\b")

_SENTENCE_END = re.compile(r"([.!?]+[\"')\]]*|[\u3002\uff01\uff1f]+)(\s+|$)|\n\s*\n|\n")
_CLAUSE_END = re.compile(r"[,;:\u3001\uff0c\uff1b](\s+|$)")


def english_rules(language: str) -> bool:
    """English conventions (abbreviations, money) apply to English and to multilingual ("mul") voices."""
    language = language.lower()
    return language.startswith("en") or language == "mul"


def normalize(text: str, language: str = "en") -> str:
    """Clean ``text`` for a phonemiser: unicode, whitespace, and English conventions."""
    text = unicodedata.normalize("NFC", text).translate(_TRANSLATE)
    text = _CONTROL.sub(" ", text).replace("\r\n", "\n").replace("\r", "\n")
    if english_rules(language):
        text = _LATIN_PATTERN.sub(lambda m: _LATIN[m.group(1).lower()], text)
        text = _NUMBER_ABBREVIATION.sub("number", text)
        text = _ABBREVIATION.sub(lambda m: _ENGLISH_ABBREVIATIONS[m.group(1).lower()], text)
        text = _MONEY.sub(_say_money, text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return "\n".join(lines).strip()


def _say_money(match: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY[match.group(1)]
    whole = match.group(2).replace(",", "")
    words = f"{whole} {one if whole == '1' else many}"
    if match.group(3):
        cents = int(match.group(3).ljust(2, "0"))
        if cents:
            words += f" {cents} {sub_one if cents == 1 else sub_many}"
    return words


def _split_long(sentence: str, max_chars: int) -> tuple[str, str]:
    """Cut ``sentence`` before ``max_chars`` at a clause, else a word boundary."""
    window = sentence[: max_chars + 1]
    clause_cuts = [m.end() for m in _CLAUSE_END.finditer(window) if m.end() >= max_chars // 4]
    if clause_cuts:
        cut = clause_cuts[-1]
    else:
        space = window.rfind(" ", max_chars // 4)
        cut = space + 1 if space > 0 else max_chars
    return sentence[:cut].strip(), sentence[cut:].strip()


class Segmenter:
    """Turns text, whole or in fragments, into segments for synthesis.

    ``push`` takes text as it arrives (a few characters at a time from an LLM)
    and returns the segments that are complete; ``flush`` returns the rest.
    """

    def __init__(self, first_max_chars: int, max_chars: int, language: str = "en") -> None:
        self.first_max_chars = first_max_chars
        self.max_chars = max_chars
        self.language = language
        self.buffer = ""
        self.emitted = 0

    @property
    def limit(self) -> int:
        return self.first_max_chars if self.emitted == 0 else self.max_chars

    def push(self, fragment: str) -> list[str]:
        self.buffer += fragment
        return self._drain(final=False)

    def flush(self) -> list[str]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[str]:
        segments: list[str] = []
        while True:
            end = self._sentence_end(final)
            if end is not None and end <= self.limit:
                head, self.buffer = self.buffer[:end], self.buffer[end:]
            elif len(self.buffer) > self.limit:
                head, self.buffer = _split_long(self.buffer, self.limit)
            elif end is not None or (final and self.buffer.strip()):
                head, self.buffer = self.buffer, ""
            else:
                return segments
            self.buffer = self.buffer.lstrip()
            head = normalize(head, self.language).replace("\n", " ")
            if self._is_speakable(head):
                segments.append(head)
                self.emitted += 1

    def _sentence_end(self, final: bool) -> int | None:
        """End of the first complete sentence in the buffer, if one is known to be complete."""
        for match in _SENTENCE_END.finditer(self.buffer):
            if match.group(1) and match.group(1).startswith(".") and self._ends_with_abbreviation(match.start()):
                continue
            # A terminator at the very end of a fragment may still grow ("3." -> "3.5"); wait for what follows.
            if match.end() < len(self.buffer) or final or self.buffer[match.end() - 1].isspace():
                return match.end()
            return None
        return None

    def _ends_with_abbreviation(self, dot: int) -> bool:
        if not english_rules(self.language):
            return False
        word = re.search(r"([A-Za-z][A-Za-z.]*)$", self.buffer[:dot])
        if word is None:
            return False
        token = word.group(1)
        if len(token) == 1 and token.isupper():
            return True  # an initial, as in "J. R. R. Tolkien"
        return token.lower() in _ENGLISH_ABBREVIATIONS or f"{token.lower()}." in _LATIN

    @staticmethod
    def _is_speakable(text: str) -> bool:
        return any(ch.isalnum() for ch in text)


def segment(text: str, first_max_chars: int, max_chars: int, language: str = "en") -> list[str]:
    """All segments of a whole text."""
    segmenter = Segmenter(first_max_chars, max_chars, language)
    return segmenter.push(text) + segmenter.flush()


def is_speakable(text: str) -> bool:
    """True when ``text`` has anything a voice can say."""
    return Segmenter._is_speakable(normalize(text))
