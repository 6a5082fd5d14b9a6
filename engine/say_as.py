"""SSML ``<say-as>`` content as spoken English words, each piece mapped to the characters it was said from.

The SSML front end hands over an element's text and its ``interpret-as`` (``format``, ``detail``); what comes back
is a list of pieces ``(words, (start, end))``, the span being character offsets into that text, in order. The caller
joins the words with single blanks and maps each onto its span, so word timings still point at what the client
wrote. ``None`` means "not mine": an unknown kind, or content that is not what the kind says (a date that is not a
date), which the caller then reads as ordinary text.

Kinds (``interpret-as`` matched case-insensitively; the names SSML 1.1's note, Google, Azure and Amazon use):

- ``characters``, ``spell-out``, ``spell``, ``verbatim``: letter by letter, letters by their English names spelled
  so espeak-ng says the name ("eigh" for A: espeak reads "ay" as "eye"), digits as digit words, common symbols by
  name; blanks and other characters are skipped.
- ``cardinal``, ``number``: "1,234" "one thousand two hundred thirty four", "-3.14" "minus three point one four".
- ``ordinal``: "3" or "3rd" "third".
- ``digits``, ``digit``, ``number_digit``: each digit a word.
- ``date``: see :func:`_date`; fields are read in the order they are written.
- ``time``: see :func:`_time`.
- ``telephone``, ``phone``: digit by digit, a comma after each group so the voice pauses.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from rtvoice.engine.mapped_text import Span
from rtvoice.engine.spoken import cardinal, digit_words, ordinal, year

Piece = tuple[str, Span]
"""Words and the span of the ``<say-as>`` text they were said from."""

# -- letter by letter -------------------------------------------------------------------------------------------

# Spelled so espeak-ng (Piper's phonemiser) says each name as it says the letter: "ay" is "eye" to it, "eff" it
# spells out as E-F-F, and "el" and "you" it leaves unstressed.
LETTER_NAMES = {
    "a": "eigh",
    "b": "bee",
    "c": "see",
    "d": "dee",
    "e": "ee",
    "f": "ef",
    "g": "gee",
    "h": "aitch",
    "i": "eye",
    "j": "jay",
    "k": "kay",
    "l": "ell",
    "m": "em",
    "n": "en",
    "o": "oh",
    "p": "pee",
    "q": "cue",
    "r": "ar",
    "s": "ess",
    "t": "tee",
    "u": "ewe",
    "v": "vee",
    "w": "double you",
    "x": "ex",
    "y": "why",
    "z": "zee",
}
SYMBOL_NAMES = {
    "-": "dash",
    ".": "dot",
    "@": "at",
    "_": "underscore",
    "/": "slash",
    "\\": "backslash",
    "#": "hash",
    "+": "plus",
    "&": "and",
    "*": "star",
    "%": "percent",
    "=": "equals",
    ":": "colon",
    "~": "tilde",
    "$": "dollar",
}


def _character_name(char: str) -> str | None:
    """A character's spoken name; ``None`` for one that is skipped (blanks, punctuation without a name)."""
    if char.isdecimal():
        return digit_words(char)
    base = unicodedata.normalize("NFKD", char)[:1].lower()  # "é" is spelled as the letter e
    return LETTER_NAMES.get(base) or SYMBOL_NAMES.get(char)


def _characters(text: str) -> list[Piece]:
    pieces = []
    for i, char in enumerate(text):
        name = _character_name(char)
        if name is not None:
            pieces.append((name, (i, i + 1)))
    return pieces


def _digits(text: str) -> list[Piece] | None:
    pieces = [(digit_words(c), (i, i + 1)) for i, c in enumerate(text) if c.isdecimal()]
    return pieces or None


# -- numbers ----------------------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"\s*(?P<sign>[-+\u2212])?(?P<whole>\d{1,3}(?:,\d{3})+|\d+)?(?:(?P<point>\.)(?P<fraction>\d+))?\s*", re.ASCII
)
_ORDINAL = re.compile(r"\s*(?P<number>(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?:st|nd|rd|th)?)\s*", re.ASCII | re.IGNORECASE)


def _cardinal(text: str) -> list[Piece] | None:
    """The sign, the whole part, "point" and each digit after it, each mapped to what it reads."""
    match = _NUMBER.fullmatch(text)
    if match is None or not (match["whole"] or match["fraction"]):
        return None
    pieces: list[Piece] = []
    if match["sign"]:
        pieces.append(("plus" if match["sign"] == "+" else "minus", match.span("sign")))
    if match["whole"]:
        pieces.append((cardinal(int(match["whole"].replace(",", ""))), match.span("whole")))
    if match["fraction"]:
        pieces.append(("point", match.span("point")))
        start = match.start("fraction")
        pieces += [(digit_words(d), (start + k, start + k + 1)) for k, d in enumerate(match["fraction"])]
    return pieces


def _ordinal(text: str) -> list[Piece] | None:
    match = _ORDINAL.fullmatch(text)
    if match is None:
        return None
    return [(ordinal(int(match["whole"].replace(",", ""))), match.span("number"))]


# -- dates ------------------------------------------------------------------------------------------------------

MONTH_NAMES = ("January February March April May June July August September October November December").split()
_MONTH_BY_NAME = {name.lower(): i for i, name in enumerate(MONTH_NAMES, 1)} | {
    name.lower()[:3]: i for i, name in enumerate(MONTH_NAMES, 1)
}
_MONTH_BY_NAME["sept"] = 9
_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
DATE_FORMATS = frozenset({"mdy", "dmy", "ymd", "ydm", "md", "dm", "ym", "my", "d", "m", "y"})
_DATE_FIELD = re.compile(r"[^\s/.,\-]+")
_DAY = re.compile(r"(\d{1,2})(?:st|nd|rd|th)?", re.ASCII | re.IGNORECASE)
_YEAR = re.compile(r"['\u2019]?(\d{1,4})", re.ASCII)


def _month(field: str) -> int | None:
    number = int(field) if field.isascii() and field.isdigit() else _MONTH_BY_NAME.get(field.lower())
    return number if number is not None and 1 <= number <= 12 else None


def _spoken_year(field: str) -> tuple[str, int, int] | None:
    """A year's words, its value and how many digits it was written with: "'99" "ninety nine", "05" "oh five"."""
    match = _YEAR.fullmatch(field)
    if match is None:
        return None
    digits = match[1]
    value = int(digits)
    if len(digits) == 2:
        words = f"oh {digit_words(digits[1])}" if digits[0] == "0" else cardinal(value)
    else:
        words = year(value)
    return words, value, len(digits)


def _leap(value: int) -> bool:
    return value % 4 == 0 and (value % 100 != 0 or value % 400 == 0)


def _date(text: str, format: str | None) -> list[Piece] | None:
    """A date read in the order its fields are written, the way each field is said: the month by its name, the day
    as an ordinal, the year as a year. A day written before its month reads "the fifth of January"; after it,
    "January fifth". So mdy "1/5/2024" is "January fifth twenty twenty four", dmy "5/1/2024" "the fifth of January
    twenty twenty four", ymd "2024-01-05" "twenty twenty four January fifth". Fields are separated by "/", "-", ".",
    commas or blanks; a month may be written by name ("Jan"). Without a format, mdy (ymd where the first of three
    fields has four digits: ISO); an unknown format is mdy. ``None`` for a field that is not what its place says
    (month 13, the 31st of April, a different number of fields)."""
    fields = list(_DATE_FIELD.finditer(text))
    order = (format or "").strip().lower()
    if order not in DATE_FORMATS:
        iso = format is None and len(fields) == 3 and re.fullmatch(r"\d{4}", fields[0].group()) is not None
        order = "ymd" if iso else "mdy"
    if len(fields) != len(order):
        return None
    month = day = None
    year_value: int | None = None
    words: dict[str, str] = {}
    for kind, field in zip(order, fields, strict=True):
        value = field.group()
        if kind == "m":
            month = _month(value)
            if month is None:
                return None
            words["m"] = MONTH_NAMES[month - 1]
        elif kind == "d":
            found = _DAY.fullmatch(value)
            day = int(found[1]) if found else 0
            if not 1 <= day <= 31:
                return None
            words["d"] = ordinal(day)
        else:
            said = _spoken_year(value)
            if said is None:
                return None
            words["y"], value_of_year, written_digits = said
            year_value = value_of_year if written_digits >= 3 else None  # "'99": its century is unknown
    if month is not None and day is not None:
        days = 28 if month == 2 and year_value is not None and not _leap(year_value) else _DAYS_IN_MONTH[month]
        if day > days:
            return None
    day_first = "d" in order and ("m" not in order or order.index("d") < order.index("m"))
    if day_first:  # "the fifth of January"; a day alone is "the fifth"
        words["d"] = f"the {words['d']}" + (" of" if "m" in order else "")
    return [(words[kind], field.span()) for kind, field in zip(order, fields, strict=True)]


# -- times ------------------------------------------------------------------------------------------------------

_TIME = re.compile(
    r"\s*(?P<h>\d{1,2})(?:[:.](?P<m>\d{2})(?:[:.](?P<s>\d{2}))?)?\s*(?P<ap>(?P<half>[ap])\.?\s?m\.?)?\s*",
    re.ASCII | re.IGNORECASE,
)


def _minutes(minutes: int) -> str:
    return f"oh {cardinal(minutes)}" if minutes < 10 else cardinal(minutes)


def _time(text: str, format: str | None) -> list[Piece] | None:
    """A time in words, fields in their written order: "2:30pm" "two thirty PM", "14:30" "fourteen thirty", "2:05"
    "two oh five", "7:00" or "7" "seven o'clock", "7am" "seven AM", "14:00" "fourteen hundred", "02:30:15" "two
    thirty and fifteen seconds". A format naming 12 ("hms12") says a 24-hour time on the 12-hour clock ("14:30" "two
    thirty PM"); one naming 24 ("hms24") says a 12-hour time on the 24-hour clock ("2:30pm" "fourteen thirty").
    "AM" and "PM" are written so, not "A M": espeak-ng reads a lone "A" as the article."""
    match = _TIME.fullmatch(text)
    if match is None:
        return None
    hour, minutes = int(match["h"]), int(match["m"] or 0)
    seconds = int(match["s"]) if match["s"] else None
    half = match["half"].lower() if match["half"] else None
    if minutes > 59 or (seconds is not None and seconds > 59):
        return None
    if hour > 23 or (half is not None and not 1 <= hour <= 12):
        return None
    clock = (format or "").lower()
    said_half: str | None = half
    if half is not None and "24" in clock:
        hour, said_half = hour % 12 + (12 if half == "p" else 0), None
    elif half is None and "12" in clock:
        hour, said_half = hour % 12 or 12, "a" if hour < 12 else "p"
    pieces: list[Piece] = [(cardinal(hour), match.span("h"))]
    if minutes:
        pieces.append((_minutes(minutes), match.span("m")))
    elif said_half is None or seconds:  # "seven o'clock", "fourteen hundred"; with AM or PM, "seven AM"
        top = "o'clock" if 1 <= hour <= 12 else "hundred"
        if match["m"]:
            pieces.append((top, match.span("m")))
        else:
            pieces[0] = (f"{pieces[0][0]} {top}", pieces[0][1])
    if seconds:
        pieces.append((f"and {cardinal(seconds)} {'second' if seconds == 1 else 'seconds'}", match.span("s")))
    if said_half is not None:
        # An "AM" the format added, not the text, maps to what was said before it.
        span = match.span("ap") if half is not None else pieces[-1][1]
        pieces.append(("AM" if said_half == "a" else "PM", span))
    return pieces


# -- telephone numbers ------------------------------------------------------------------------------------------

_PHONE_GROUP = re.compile(r"\d+|[^\W\d_]+")
_EXTENSION = frozenset({"x", "ext", "extension"})


def _telephone(text: str) -> list[Piece] | None:
    """Digit by digit ("0" is "zero"), a comma on the last digit of each group (groups split by anything that is not
    a digit or letter) so the voice pauses between them; a leading "+" is "plus"; letters ("1-800-FLOWERS") are read
    as written, "x" or "ext" before an extension as "extension"."""
    if not any(c.isdecimal() for c in text):
        return None
    pieces: list[Piece] = []
    stripped = len(text) - len(text.lstrip())
    if text[stripped : stripped + 1] == "+":
        pieces.append(("plus", (stripped, stripped + 1)))
    groups = list(_PHONE_GROUP.finditer(text))
    for k, group in enumerate(groups):
        run = group.group()
        if run.isdecimal():
            start = group.start()
            said = [(digit_words(d), (start + i, start + i + 1)) for i, d in enumerate(run)]
        else:
            said = [("extension" if run.lower() in _EXTENSION else run, group.span())]
        if k < len(groups) - 1 and said[-1][0] != "extension":  # the pause between groups, on its last word
            words, span = said[-1]
            said[-1] = (words + ",", span)
        pieces += said
    return pieces


# -- the whole --------------------------------------------------------------------------------------------------

_KINDS: dict[str, Callable[[str, str | None], list[Piece] | None]] = {
    "characters": lambda text, _: _characters(text),
    "spell-out": lambda text, _: _characters(text),
    "spell": lambda text, _: _characters(text),
    "verbatim": lambda text, _: _characters(text),
    "cardinal": lambda text, _: _cardinal(text),
    "number": lambda text, _: _cardinal(text),
    "ordinal": lambda text, _: _ordinal(text),
    "digits": lambda text, _: _digits(text),
    "digit": lambda text, _: _digits(text),
    "number_digit": lambda text, _: _digits(text),
    "date": _date,
    "time": _time,
    "telephone": lambda text, _: _telephone(text),
    "phone": lambda text, _: _telephone(text),
}
KINDS = frozenset(_KINDS)
"""The ``interpret-as`` values :func:`say_as` knows (lower case)."""


def say_as(text: str, interpret_as: str, format: str | None = None, detail: str | None = None) -> list[Piece] | None:
    """``<say-as interpret-as=... format=... detail=...>text</say-as>`` as spoken pieces ``(words, (start, end))``,
    spans into ``text``, in order; the caller joins the words with single blanks. ``None`` where ``interpret_as``
    is unknown or ``text`` is not what it says (the caller reads it as plain text instead); ``characters``-like
    kinds always read what they can. ``detail`` is accepted for SSML's sake and changes nothing."""
    kind = _KINDS.get(interpret_as.strip().lower())
    return kind(text, format) if kind is not None else None
