"""Text in its spoken form: numbers, money, dates, times, units, abbreviations, Roman numerals, phone numbers,
e-mail addresses and URLs, rewritten as a voice reads them, every character still mapped to the client's.

wetext (WeNet's text normaliser: prebuilt WFST grammars run by kaldifst) reads most of it. A thin layer of rules
runs first, for what wetext 0.1.8 reads wrong (money with cents, a leading "one thousand", four-digit numbers as
years, numeric dates day first) or leaves as written (Roman numerals, tbsp., e.g.): each rule writes the words itself
or a form wetext then reads right. wetext returns a plain string; it is aligned back onto its input word by word, so
an unchanged word keeps its own characters and a rewritten run takes the span of what it replaced.

Only the words that need it go through wetext: each run of words holding a digit, one of a few symbols, an e-mail
address or a URL, with the word after it (a unit: "5 kg"), is normalised on its own. The rest of a sentence never
reaches wetext, so its word list ("TV" -> "Television", "U.S." -> "US") cannot touch plain words, and text without
such words costs no wetext call at all. Chinese and Japanese lines (CosyVoice2's "mul" text) go to wetext's Chinese
or Japanese grammar whole, aligned character by character.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from typing import Any

from rtvoice.engine.mapped_text import MappedText, Pieces, Span

# -- number words -----------------------------------------------------------------------------------------------

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_NUMBER_WORDS = frozenset(_ONES) | frozenset(_TENS[2:]) | {"hundred"}


def _below_thousand(n: int) -> list[str]:
    words = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10])
        n %= 10
    if n:
        words.append(_ONES[n])
    return words


def cardinal(n: int) -> str:
    """``n`` in words as an American says it: 1250 is "one thousand two hundred fifty" (no "and", no hyphens, as
    wetext writes them); digit by digit from 10^15 on."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n >= 10**15:
        return digit_words(str(n))
    if n == 0:
        return "zero"
    words = []
    for scale, name in _SCALES:
        if n >= scale:
            words += [*_below_thousand(n // scale), name]
            n %= scale
    return " ".join(words + _below_thousand(n))


def ordinal(n: int) -> str:
    """``n``-th in words: "twenty first"."""
    *head, last = cardinal(n).split()
    last = _ORDINAL_WORDS.get(last) or (last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return " ".join([*head, last])


def year(n: int) -> str:
    """A year as it is said: 1990 "nineteen ninety", 1905 "nineteen oh five", 1900 "nineteen hundred", 2005 "two
    thousand five", 2024 "twenty twenty four"."""
    if n % 1000 == 0 or 2000 <= n <= 2009 or not 1000 <= n <= 9999:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return f"{cardinal(high)} hundred"
    return f"{cardinal(high)} {'oh ' + _ONES[low] if low < 10 else cardinal(low)}"


def digit_words(digits: str) -> str:
    """Each digit of ``digits`` in words: "four four"."""
    return " ".join(_ONES[int(d)] for d in digits if d.isdigit())


def _plural(words: str) -> str:
    """The last word of a number in the plural: "nineteen ninety" -> "nineteen nineties"."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _at_end(match: re.Match[str]) -> bool:
    """Whether nothing but blanks follows ``match``: its dot is the end of the sentence too."""
    return not match.string[match.end() :].strip()


def _word_before(match: re.Match[str]) -> str:
    found = re.search(r"([A-Za-z][A-Za-z.]*)[^\w]{0,3}$", match.string[max(0, match.start() - 40) : match.start()])
    return found.group(1) if found else ""


def _word_after(match: re.Match[str]) -> str:
    found = re.match(r"\s+([A-Za-z][A-Za-z.]*)", match.string[match.end() :])
    return found.group(1) if found else ""


# -- money ------------------------------------------------------------------------------------------------------

_CURRENCIES: dict[str, tuple[str, str, str, str]] = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "\u00a3": ("pound", "pounds", "penny", "pence"),
    "\u20ac": ("euro", "euros", "cent", "cents"),
    "\u00a5": ("yen", "yen", "", ""),
}
_SCALE_LETTERS = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion", "tn": "trillion"}
_MONEY = re.compile(
    r"(?<![\w$\u00a3\u20ac\u00a5])(?P<currency>[$\u00a3\u20ac\u00a5])[^\S\n]?"
    r"(?P<whole>\d{1,3}(?:,\d{3})+|\d+)?(?:\.(?P<fraction>\d+))?"
    r"(?:[^\S\n]?(?P<scale>thousand|million|billion|trillion)|(?P<letter>[kKmMbB]n?|tn))?(?!\w)"
)
_MONEY_RANGE = re.compile(r"(?<=\d)[^\S\n]?-[^\S\n]?(?=[$\u00a3\u20ac\u00a5]\d)")
"""A range of money: "$5-$10" is "five dollars to ten dollars"."""
_PENCE = re.compile(r"(?<![\w.,])(?P<pence>\d{1,2})p\b")
"""Pence: "99p"; "1080p" is not (three digits and more are left to wetext)."""
_CENTS = re.compile(r"(?<![\w.,])(?P<cents>\d+)[^\S\n]?\u00a2")


def _say_money(match: re.Match[str]) -> str:
    """Money: "$1,250.75" -> "one thousand two hundred fifty dollars and seventy five cents", "$3.2 million" ->
    "three point two million dollars". wetext drops a leading "one" ("thousand two hundred...") and reads cents as a
    decimal ("one point five dollars")."""
    one, many, sub_one, sub_many = _CURRENCIES[match["currency"]]
    whole, fraction = match["whole"], match["fraction"]
    if whole is None and fraction is None:
        return match.group(0)
    amount = int((whole or "0").replace(",", ""))
    scale = match["scale"] or _SCALE_LETTERS.get((match["letter"] or "").lower())
    if scale:
        return f"{cardinal(amount)}{' point ' + digit_words(fraction) if fraction else ''} {scale} {many}"
    if fraction and (len(fraction) > 2 or not sub_many):
        return f"{cardinal(amount)} point {digit_words(fraction)} {many}"
    cents = int(fraction.ljust(2, "0")) if fraction else 0
    words = []
    if amount or not cents:
        words.append(f"{cardinal(amount)} {one if amount == 1 else many}")
    if cents:
        words.append(f"{cardinal(cents)} {sub_one if cents == 1 else sub_many}")
    return " and ".join(words)


def _say_pence(match: re.Match[str]) -> str:
    pence = int(match["pence"])
    return f"{cardinal(pence)} {'penny' if pence == 1 else 'pence'}"


def _say_cents(match: re.Match[str]) -> str:
    cents = int(match["cents"])
    return f"{cardinal(cents)} {'cent' if cents == 1 else 'cents'}"


# -- dates ------------------------------------------------------------------------------------------------------

_MONTHS = ("January February March April May June July August September October November December").split()
_MONTH_NUMBERS = {name.lower(): i for i, name in enumerate(_MONTHS, 1)} | {
    name.lower()[:3]: i for i, name in enumerate(_MONTHS, 1) if name != "May"
}
_MONTH_NUMBERS["sept"] = 9
_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MONTH = (
    r"(?P<month>(?:January|February|March|April|May|June|July|August|September|October|November|December)\b"
    r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\b\.?)"
)
_NUMERIC_DATE = re.compile(
    r"(?<![\w/.\-])(?P<a>\d{1,2})(?P<sep>[/.\-])(?P<b>\d{1,2})(?P=sep)(?P<y>\d{4}|\d{2})(?![\w/]|[.\-]\d)"
)
_ISO_DATE = re.compile(r"(?<![\w/.\-])(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})(?![\w\-]|\.\d)")
_WRITTEN_DATE = re.compile(
    rf"\b{_MONTH}[^\S\n]+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?(?![\w]|[.,:]\d)(?:,?[^\S\n]+(?P<y>\d{{4}})(?![\w]|[.,:]\d))?"
)
_DAY_FIRST_DATE = re.compile(
    rf"(?<![\w.,])(?P<d>\d{{1,2}})(?P<suffix>st|nd|rd|th)?[^\S\n]+(?P<of>of[^\S\n]+)?{_MONTH}"
    rf"(?:,?[^\S\n]+(?P<y>\d{{4}})(?![\w]|[.,:]\d))?"
)
DAY_FIRST_LANGUAGES = ("en-gb", "en-au", "en-nz", "en-ie", "en-in", "en-za")
"""English written day first (4/7/1990 is the fourth of July); other English, and "mul", month first (US)."""


def _day_first(language: str) -> bool:
    return language.lower().replace("_", "-").startswith(DAY_FIRST_LANGUAGES)


def _two_digit_year(digits: str) -> str:
    return f"oh {_ONES[int(digits[1])]}" if digits[0] == "0" else cardinal(int(digits))


def _say_date(match: re.Match[str], month: int, day: int, groups: tuple[str, str], day_first: bool) -> Pieces:
    """Month, day and (where written) year as said: "July fourth, nineteen ninety" (US), "the fourth of July,
    nineteen ninety" (day first). Each word maps to the number it reads."""
    digits = match["y"]
    spoken_year = (year(int(digits)) if len(digits) == 4 else _two_digit_year(digits)) if digits else ""
    comma = "," if spoken_year else ""
    before = match.string[: match.start()]
    if day_first:
        the = "" if re.search(r"\bthe[^\S\n]+$", before, re.IGNORECASE) else "the "
        pieces: list[tuple[str, str | int | None]] = [
            (f"{the}{ordinal(day)} of", groups[1]),
            (" ", None),
            (_MONTHS[month - 1] + comma, groups[0]),
        ]
    else:
        pieces = [(_MONTHS[month - 1], groups[0]), (" ", None), (ordinal(day) + comma, groups[1])]
    if spoken_year:
        pieces += [(" ", None), (spoken_year, "y")]
    text, group = pieces[-1]
    pieces[-1] = (text + _full_stop(match), group)
    return pieces


def _valid(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month]


def _numeric_date(day_first: bool) -> Callable[[re.Match[str]], str | Pieces]:
    def say(match: re.Match[str]) -> str | Pieces:
        a, b = int(match["a"]), int(match["b"])
        if match["sep"] != "/" and len(match["y"]) != 4:
            return match.group(0)
        first_is_day = day_first or match["sep"] == "."
        if a > 12 >= b:
            first_is_day = True
        elif b > 12 >= a:
            first_is_day = False
        month, day, groups = (b, a, ("b", "a")) if first_is_day else (a, b, ("a", "b"))
        if not _valid(month, day):
            return match.group(0)
        return _say_date(match, month, day, groups, day_first)

    return say


def _iso_date(day_first: bool) -> Callable[[re.Match[str]], str | Pieces]:
    def say(match: re.Match[str]) -> str | Pieces:
        month, day = int(match["m"]), int(match["d"])
        return _say_date(match, month, day, ("m", "d"), day_first) if _valid(month, day) else match.group(0)

    return say


def _written_date(match: re.Match[str]) -> str | Pieces:
    month, day = _MONTH_NUMBERS[match["month"].rstrip(".").lower()], int(match["d"])
    return _say_date(match, month, day, ("month", "d"), False) if _valid(month, day) else match.group(0)


def _day_first_date(match: re.Match[str]) -> str | Pieces:
    month, day = _MONTH_NUMBERS[match["month"].rstrip(".").lower()], int(match["d"])
    if not (match["suffix"] or match["of"] or match["y"]) or not _valid(month, day):
        return match.group(0)  # "5 May" may be five of something
    return _say_date(match, month, day, ("month", "d"), True)


# -- years and four-digit numbers -------------------------------------------------------------------------------

_DECADE = re.compile(r"(?<![\w'])(?P<decade>1\d\d0|20\d0)s\b")
_FOUR_DIGITS = re.compile(
    r"(?<![\w,.:/$\u00a3\u20ac\u00a5#+\-])(?P<a>\d{4})(?:-(?P<b>\d{4}|\d{2}))?(?![\w%\u00b0]|[,.:/\-]\d)"
)
_ERAS = frozenset({"BC", "BCE", "AD", "CE", "B.C.", "A.D.", "B.C", "A.D"})
_YEAR_CUES = frozenset(
    "since year circa c. ca. ad a.d. until till during spring summer autumn fall winter early late mid".split()
) | frozenset(_MONTH_NUMBERS)
_QUANTITY_CUES = frozenset(
    "about over under nearly almost approximately roughly some than exactly only just paid pay pays costs cost "
    "weighs weighed totals total".split()
)
_COUNTED = frozenset(
    "dollars euros pounds cents pence yen yuan rupees francs people persons men women children students "
    "employees workers users customers members visitors players votes voters residents soldiers troops copies "
    "items units pieces words pages points steps calories miles kilometers kilometres meters metres feet inches "
    "yards kilograms grams tons tonnes liters litres gallons bytes bits pixels seconds minutes hours days weeks "
    "months times km kg mi ft lb lbs oz mg ml gb mb kb tb hz khz mhz ghz kw kwh mph kph".split()
)
_NOT_PLURAL = frozenset(
    "does goes says sees seems marks makes takes gives brings comes becomes remains begins ends starts shows means "
    "looks feels gets puts lets sets wins loses plays follows includes contains requires changes this thus plus "
    "minus always perhaps sometimes afterwards besides whereas towards unless across news series".split()
)


def _say_decade(match: re.Match[str]) -> str:
    """A decade: "1990s" -> "nineteen nineties" (wetext: "one thousand nine hundred and ninety seconds")."""
    return _plural(year(int(match["decade"])))


def _counts_something(word: str, number: int) -> bool:
    """Whether ``word`` after a four-digit number makes it a count ("1250 dollars"), not a year ("1990 was").
    Close to now (1900-2099) only the listed nouns do: "2024 elections" is a year."""
    lower = word.lower()
    if lower in _COUNTED:
        return True
    plural = word[:1].islower() and len(word) > 3 and lower.endswith("s") and not lower.endswith("ss")
    return plural and lower not in _NOT_PLURAL and not 1900 <= number <= 2099


def _grouped(n: int) -> str:
    """A count as wetext reads it right: "2,500" (wetext reads "2500" as a year, "twenty five hundred")."""
    return f"{n // 1000},{n % 1000:03d}" if n >= 1000 else str(n)


def _say_four_digits(match: re.Match[str]) -> str | Pieces:
    """A four-digit number from 1000 to 2999: a year ("in 1990", "1990-95", "1066 AD", and by default) or a count
    ("1250 dollars", "about 1500 people"), which wetext would read as a year."""
    first, last = int(match["a"]), match["b"]
    if not 1000 <= first <= 2999:
        return match.group(0)
    before, after = _word_before(match), _word_after(match)
    is_year = after in _ERAS or before.lower() in _YEAR_CUES
    if not is_year and (_counts_something(after, first) or before.lower() in _QUANTITY_CUES):
        if last is None:
            return _grouped(first)
        return f"{_grouped(first)} to {_grouped(int(last))}" if len(last) == 4 else match.group(0)
    if last is None:
        return year(first)
    if len(last) == 4 and int(last) <= first:
        return match.group(0)
    spoken_last = year(int(last)) if len(last) == 4 else _two_digit_year(last)
    return [(f"{year(first)} to", "a"), (" ", None), (spoken_last, "b")]


# -- ordinals, signs, phone numbers -----------------------------------------------------------------------------

_BARE_INTEGER = re.compile(
    r"(?<![\w.,:/\-+$\u00a3\u20ac\u00a5#@'~(\[])(?P<n>\d{1,3}(?:,\d{3})+|\d{1,15})"
    r"(?=[^\S\n]*(?:[,;!?\"](?!\d)|[.:](?!\d)|$)"
    r"|[^\S\n]+(?:(?!(?:kcal|kbps|mbps)\b)[a-z]{4,}|of|and|or|to|in|on|at|by|for|the|an|a|is|are|was|new|old|big)"
    r"(?![\w'@]|\.\w))"
)
"""An integer before punctuation, the end, or a plain word ("3, 4 and 5.", "3 cats"): ours, which costs nothing
where wetext costs about 0.5 ms a number. One before anything else (a unit: "5 kg", "5 GB", "5 kcal"; "5 o'clock")
is wetext's; years are read before (``_FOUR_DIGITS``)."""
_ORDINAL = re.compile(r"(?<![\w.,])(?P<n>\d+)(?:st|nd|rd|th)\b")
_INTERNATIONAL_PHONE = re.compile(
    r"(?<![\w+])\+(?P<country>\d{1,3})(?P<rest>(?:[ .\-]\(?\d{1,5}\)?){2,6}|\d{6,12})(?![\w])"
)
_PLUS = re.compile(r"(?<![\w+])\+(?=\d)")
_NUMBER_SIGN = re.compile(r"(?<![\w#&])#(?=\d)")
_TILDE = re.compile(r"(?<!\w)~[^\S\n]?(?=\d)")
_ALWAYS = re.compile(r"(?<![\w/])24/7(?![\w/])")
_EMERGENCY = re.compile(r"(?<![\w.,\-])(?P<number>911)(?!\w|[.,\-]\d)")
"""The emergency number is said digit by digit ("nine one one"); wetext: "nine hundred eleven"."""
_VERSION = re.compile(r"(?<![\w.])(?P<version>\d+(?:\.\d+){2,})(?![\w]|\.\d)")
"""Dotted numbers past a decimal ("2.0.1", "192.168.0.1"): each part a number, "point" between them."""
_FEET_INCHES = re.compile(r"(?<![\w.])(?P<feet>\d)['\u2032][^\S\n]?(?P<inches>\d{1,2})(?:\"|\u2033|'')(?!\w)")


def _say_integer(match: re.Match[str]) -> str:
    return cardinal(int(match["n"].replace(",", "")))


def _say_ordinal(match: re.Match[str]) -> str:
    return ordinal(int(match["n"]))


def _say_phone(match: re.Match[str]) -> str:
    """An international number: "+44 20 7946 0958" -> "plus four four, two zero, seven nine four six, zero nine five
    eight" (wetext fails on a leading "+")."""
    groups = re.findall(r"\d+", match["rest"])
    if sum(len(g) for g in groups) < 6:
        return match.group(0)
    return ", ".join([f"plus {digit_words(match['country'])}", *(digit_words(g) for g in groups)])


def _say_emergency(match: re.Match[str]) -> str:
    return digit_words(match["number"])


def _say_version(match: re.Match[str]) -> str:
    return " point ".join(cardinal(int(part)) for part in match["version"].split("."))


def _say_height(match: re.Match[str]) -> Pieces:
    inches = "inch" if match["inches"] == "1" else "inches"
    return [(f"{match['feet']} feet", "feet"), (" ", None), (f"{match['inches']} {inches}", "inches")]


# -- Roman numerals ---------------------------------------------------------------------------------------------

_ROMAN = r"(?=[IVXLC])C{0,3}(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
_REGNAL_ROMAN = r"(?=[IVX])X{0,3}(?:IX|IV|V?I{0,3})"
_ROMAN_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}
_NUMBERED = re.compile(
    r"\b(?P<context>(?i:chapter|part|volume|vol\.|book|act|scene|section|article|appendix|episode|phase|stage|round"
    r"|season|psalm|title|type|class|level|grade|mark|apollo|world[^\S\n]+war|super[^\S\n]+bowl))"
    rf"[^\S\n]+(?P<numeral>{_ROMAN})(?![\w']|\.\w)"
)
_REGNAL_NAMES = (
    "Henry Louis Edward George William Charles Elizabeth Mary James Richard John Philip Frederick Peter Catherine "
    "Alexander Nicholas Pius Benedict Gregory Leo Innocent Clement Boniface Urban Paul Francis Ferdinand Isabella "
    "Alfonso Carlos Juan Gustav Gustavus Christian Olaf Harald Haakon Eric Erik Ivan Casimir Sigismund Stephen Anne "
    "Malcolm David Robert Edmund Harold Rama Ramesses Ptolemy Constantine Justinian Leopold Otto Wilhelm Napoleon "
    "Joseph Pedro Manuel Umberto Albert Rudolf Selim Mehmed Murad Suleiman Ahmed Mahmud Amenhotep Thutmose Felipe "
    "Willem Margrethe Carl Sancho Baldwin Conrad Ludwig Maximilian Matthias Ladislaus Victor Amadeus"
).split()
_RULER_TITLES = "King Queen Pope Emperor Empress Tsar Czar Tsarina Kaiser Prince Princess Duke Duchess Sultan Pharaoh"
_REGNAL = re.compile(
    rf"\b(?P<name>(?P<title>(?:{'|'.join(_RULER_TITLES.split())})[^\S\n]+[A-Z][a-z]+)|(?:{'|'.join(_REGNAL_NAMES)}))"
    rf"[^\S\n]+(?P<numeral>{_REGNAL_ROMAN})(?![\w']|\.\w)"
)
_WORLD_WAR = re.compile(r"\bWW(?P<n>II|I|1|2)\b")
_LONE_I_ENDS = re.compile(r"(?:[^\S\n]*(?:$|[,.;:!?)\]])|'s\b|[^\S\n]+(?:of|and)\b)")
"""What may follow an "I" read as a numeral ("Part I of", "Elizabeth I."): never a word, which makes it the pronoun
("the part I like", "Henry I saw")."""


def roman_value(numeral: str) -> int:
    values = [_ROMAN_DIGITS[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def _lone_i_allowed(match: re.Match[str], capitalised: bool) -> bool:
    return match["numeral"] != "I" or (capitalised and _LONE_I_ENDS.match(match.string, match.end()) is not None)


def _say_numbered(match: re.Match[str]) -> str | Pieces:
    """A numbered part: "Chapter IV" -> "Chapter four", "World War II" -> "World War two" (wetext reads only the
    last)."""
    if not _lone_i_allowed(match, match["context"][0].isupper()):
        return match.group(0)
    return [(match["context"], "context"), (" ", None), (cardinal(roman_value(match["numeral"])), "numeral")]


def _say_regnal(match: re.Match[str]) -> str | Pieces:
    """A regnal number: "Henry VIII" -> "Henry the Eighth"; after a title any capitalised name ("King Tut II")."""
    if match["numeral"] == "I" and not match["title"] and not _lone_i_allowed(match, True):
        return match.group(0)
    spoken = " ".join(word.capitalize() for word in ordinal(roman_value(match["numeral"])).split())
    return [(match["name"], "name"), (" ", None), (f"the {spoken}", "numeral")]


def _say_world_war(match: re.Match[str]) -> str:
    return "World War " + ("one" if match["n"] in ("I", "1") else "two")


# -- times, units, abbreviations --------------------------------------------------------------------------------

_MERIDIEM = re.compile(r"(?<=\d)(?P<blank>[^\S\n]?)(?P<word>(?P<letter>[AaPp])\.?[Mm]\.?)(?!\w)")
_UNITS = {
    "tbsp": ("tablespoon", "tablespoons"),
    "tbsps": ("tablespoon", "tablespoons"),
    "tbs": ("tablespoon", "tablespoons"),
    "tsp": ("teaspoon", "teaspoons"),
    "tsps": ("teaspoon", "teaspoons"),
    "oz": ("ounce", "ounces"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "yr": ("year", "years"),
    "yrs": ("year", "years"),
    "sec": ("second", "seconds"),
    "secs": ("second", "seconds"),
    "kwh": ("kilowatt hour", "kilowatt hours"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "kmh": ("kilometer per hour", "kilometers per hour"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "kmph": ("kilometer per hour", "kilometers per hour"),
    "m": ("meter", "meters"),
    "m/s": ("meter per second", "meters per second"),
}
"""Units wetext leaves as written ("tbsp"), keeps the dot of ("oz."), or reads wrong ("3 m": "three minutes")."""
_UNIT = re.compile(
    r"(?<=\d)(?P<blank>[^\S\n]?)(?P<word>(?P<unit>"
    + "|".join(re.escape(unit) for unit in sorted(_UNITS, key=len, reverse=True))
    + r")\.?)(?![\w/])",
    re.IGNORECASE,
)
_NUMBER_BEFORE = re.compile(r"(\d+(?:[.,/]\d+)*)[^\S\n]?$")

ABBREVIATIONS = {
    "mr": "Mister",
    "mrs": "Missus",
    "ms": "Miz",
    "dr": "Doctor",
    "prof": "Professor",
    "st": "Saint",
    "jr": "Junior",
    "sr": "Senior",
    "vs": "versus",
    "etc": "etcetera",
    "approx": "approximately",
    "dept": "department",
    "mt": "Mount",
    "vol": "volume",
    "ave": "Avenue",
    "blvd": "Boulevard",
    "rd": "Road",
    "no": "number",
    "jan": "January",
    "feb": "February",
    "mar": "March",
    "apr": "April",
    "jun": "June",
    "jul": "July",
    "aug": "August",
    "sep": "September",
    "sept": "September",
    "oct": "October",
    "nov": "November",
    "dec": "December",
}
"""What an English abbreviation with its dot is said as ("Dr." "Doctor"): the one list, for these rules and for the
segmenter, which does not end a sentence at their dots."""
_BEFORE_A_NAME = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "mt"})
"""Titles: their dot never ends a sentence, so never a full stop in what is said."""
# "No." is only an abbreviation before a number ("No. 5"); "etc." may end a sentence.
_ABBREVIATION = re.compile(
    r"\b(?P<word>" + "|".join(k for k in ABBREVIATIONS if k != "no") + r")\.(?=\s|$)", re.IGNORECASE
)
_NUMBER_ABBREVIATION = re.compile(r"\bno\.(?=[^\S\n]*\d)", re.IGNORECASE)
_STREET = re.compile(r"\b(?P<name>[A-Z][a-z]+)[^\S\n]+(?P<abbreviation>St|Dr|Rd)\.(?=\s|$)")
_ADDRESS_BEFORE = re.compile(r"\d+[A-Za-z]?[^\S\n]+(?:[A-Z][a-z]*\.?[^\S\n]+){0,3}$")
LATIN = {"e.g.": "for example", "i.e.": "that is", "a.m.": "A M", "p.m.": "P M", "cf.": "compare"}
_LATIN_PATTERN = re.compile(
    r"(?<![\w.])(?P<word>" + "|".join(re.escape(k) for k in LATIN) + r")(?=\W|$)", re.IGNORECASE
)


def is_abbreviation(word: str) -> bool:
    """Whether ``word`` (the letters before a dot: "Dr", "e.g") is an abbreviation, so its dot ends no sentence."""
    lower = word.lower()
    return lower in ABBREVIATIONS or lower in _UNITS or f"{lower}." in LATIN


def _full_stop(match: re.Match[str], before_capital: bool = False) -> str:
    """The dot of an abbreviation at the end of the text ("..., etc.") also ends its sentence: keep one. So does the
    dot of a unit, a.m. or etc. before a capital ("at 5 p.m. Then"); not that of e.g. ("e.g. John")."""
    if not match.group(0).endswith("."):
        return ""
    ends = _at_end(match) or (before_capital and re.match(r"\s+[A-Z]", match.string[match.end() :]) is not None)
    return "." if ends else ""


def _say_meridiem(match: re.Match[str]) -> Pieces:
    """A time's "a.m.": "10:45 a.m." -> "10:45 A M", which wetext then reads "ten forty five A M" (it writes "AM", a
    word)."""
    return [(" ", "blank"), (f"{match['letter'].upper()} M{_full_stop(match, before_capital=True)}", "word")]


def _say_unit(match: re.Match[str]) -> Pieces:
    """A unit after a number: "2 tbsp." -> "2 tablespoons" (wetext leaves tbsp, tsp, hrs and keeps the dot of
    "oz.")."""
    one, many = _UNITS[match["unit"].lower()]
    number = _NUMBER_BEFORE.search(match.string[: match.start()] + match["blank"])
    value = number.group(1).replace(",", "") if number else ""
    if "/" in value:
        top, _, bottom = value.partition("/")
        singular = top.isdigit() and bottom.isdigit() and int(bottom) > 0 and int(top) <= int(bottom)
    else:
        singular = value in ("1", "1.0")
    return [(" ", "blank"), (f"{one if singular else many}{_full_stop(match, before_capital=True)}", "word")]


def _say_street(match: re.Match[str]) -> str | Pieces:
    """An address's "St.": "12 Main St." -> "Street", "Elm St." not before a name -> "Street"; "St. Louis" stays
    Saint (``_ABBREVIATION``)."""
    address = _ADDRESS_BEFORE.search(match.string[: match.start()]) is not None
    abbreviation = match["abbreviation"]
    before_name = re.match(r"\s+[A-Z]", match.string[match.end() :]) is not None
    if not address and (abbreviation != "St" or before_name):
        return match.group(0)
    spoken = {"St": "Street", "Dr": "Drive", "Rd": "Road"}[abbreviation]
    return [(match["name"], "name"), (" ", None), (spoken + _full_stop(match), "abbreviation")]


def _say_abbreviation(match: re.Match[str]) -> str:
    word = match["word"].lower()
    return ABBREVIATIONS[word] + ("" if word in _BEFORE_A_NAME else _full_stop(match, before_capital=word == "etc"))


def _say_latin(match: re.Match[str]) -> str:
    time = match["word"].lower() in ("a.m.", "p.m.")
    return LATIN[match["word"].lower()] + (_full_stop(match, before_capital=True) if time else "")


# -- the rules, in order ----------------------------------------------------------------------------------------

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str | Pieces] | str]


def _rules(day_first: bool) -> tuple[Rule, ...]:
    """Ours, before wetext. Money first (its numbers are its own); dates before years, ordinals and months."""
    return (
        (_MONEY_RANGE, " to "),
        (_MONEY, _say_money),
        (_CENTS, _say_cents),
        (_PENCE, _say_pence),
        (_ISO_DATE, _iso_date(day_first)),
        (_NUMERIC_DATE, _numeric_date(day_first)),
        (_VERSION, _say_version),
        (_WRITTEN_DATE, _written_date),
        (_DAY_FIRST_DATE, _day_first_date),
        (_DECADE, _say_decade),
        (_FOUR_DIGITS, _say_four_digits),
        (_ORDINAL, _say_ordinal),
        (_INTERNATIONAL_PHONE, _say_phone),
        (_PLUS, "plus "),
        (_NUMBER_SIGN, "number "),
        (_NUMBER_ABBREVIATION, "number"),
        (_TILDE, "about "),
        (_ALWAYS, "twenty four seven"),
        (_EMERGENCY, _say_emergency),
        (_FEET_INCHES, _say_height),
        (_MERIDIEM, _say_meridiem),
        (_UNIT, _say_unit),
        (_BARE_INTEGER, _say_integer),
        (_WORLD_WAR, _say_world_war),
        (_NUMBERED, _say_numbered),
        (_REGNAL, _say_regnal),
        (_LATIN_PATTERN, _say_latin),
        (_STREET, _say_street),
        (_ABBREVIATION, _say_abbreviation),
    )


_RULES = {False: _rules(False), True: _rules(True)}
_CANDIDATE = re.compile(
    r"[\d$\u00a3\u20ac\u00a5\u00a2%&@#+=\u00d7\u00f7^~\u00b0]|://|\bwww\.|\.\w"
    r"|\b(?:" + "|".join(ABBREVIATIONS) + r")\.|(?-i:\bWW|\b(?:[IVXLC]{2,}|[VXLC])\b|\bI\b)",
    re.IGNORECASE,
)
"""Anything a rule or wetext may rewrite; a line without it is left as it is, at the cost of this one search."""

# -- wetext -----------------------------------------------------------------------------------------------------

_NORMALIZERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _normalizer(lang: str) -> Any:
    """wetext's normaliser for ``lang`` ("en", "zh", "ja"), made once and shared. Importing wetext loads its grammars
    (about 0.5 s, 40 MB); a ``Normalizer`` holds only its options, and each call composes its input with the
    immutable grammar (kaldifst's const ``TextNormalizer::Normalize``), so calls are independent, from any thread."""
    normalizer = _NORMALIZERS.get(lang)
    if normalizer is None:
        with _LOCK:
            normalizer = _NORMALIZERS.get(lang)
            if normalizer is None:
                from wetext import Normalizer

                normalizer = _NORMALIZERS[lang] = Normalizer(lang=lang, operator="tn")
    return normalizer


def prepare() -> None:
    """Load wetext's grammars now (at start), so the first text with a number does not wait for them."""
    for lang in ("en", "zh", "ja"):
        _normalizer(lang)


_TRIGGER = re.compile(
    r"\d|[$\u00a3\u20ac\u00a5\u00a2%&@#+=\u00d7\u00f7^\u00b0]|://|\bwww\.|@"
    r"|\w\.(?:com|org|net|edu|gov|io|ai|uk|de|dev|app|info)\b",
    re.IGNORECASE,
)
"""A word wetext should read: a digit, a symbol it says, an e-mail address or URL."""
_FOLLOWER = re.compile(r"[A-Za-z\u00b5\u00b0][A-Za-z\u00b5\u00b0\u00b2\u00b3/.'\-]*[,.;:!?)\"']*")
"""A plain word after such a word goes with it to wetext: it may be its unit ("5 kg", "100 km/h")."""
_TOKEN = re.compile(r"\S+")
MAX_WETEXT_RUN = 12
"""Tokens one wetext call reads at most (see ``_windows``)."""
MAX_WETEXT_CALLS = 32
"""wetext calls one request's text makes at most (``WetextBudget``); ``docs/decisions.md`` has the figures."""
_ESCAPED = re.compile(r"\\(.)")
_BARE_THOUSAND = re.compile(r"(?<![\w-])thousand\b")
_SCALE_AND = re.compile(
    r"\b(hundred|thousand|million|billion|trillion) and (?=(?:" + "|".join(_NUMBER_WORDS - {"hundred"}) + r")\b)"
)


def _wetext(text: str, lang: str) -> str | None:
    """wetext's reading of ``text``, its known slips mended; ``None`` where it fails (it asserts on some input:
    "#1", "+5", "[5]", two blanks in a row)."""
    try:
        spoken = _normalizer(lang).normalize(text)
    except Exception:  # wetext asserts or finds no path on input its grammar does not cover
        return None
    if not isinstance(spoken, str) or not spoken.strip():
        return None
    spoken = _ESCAPED.sub(r"\1", spoken)  # it escapes quotes and backslashes in its output: '\"five dogs\"'
    if lang == "en":
        written = text.lower()
        if "thousand" not in written:  # "1,250" -> "thousand two hundred and fifty": the leading "one" is dropped
            spoken = _BARE_THOUSAND.sub(_one_thousand, spoken)
        if " and " not in f" {written} ":
            spoken = _SCALE_AND.sub(r"\1 ", spoken)  # "two hundred and fifty" -> "two hundred fifty", as ours
    return spoken


def _one_thousand(match: re.Match[str]) -> str:
    before = match.string[: match.start()].split()
    return "thousand" if before and before[-1] in _NUMBER_WORDS else "one thousand"


def _windows(line: MappedText) -> list[tuple[int, int, list[bool]]]:
    """Runs of tokens for wetext: each token with a trigger, with the plain word after it. (first, end, marked)."""
    tokens = [m.group(0) for m in _TOKEN.finditer(line.text)]
    marked = [_TRIGGER.search(token) is not None for token in tokens]
    chosen = list(marked)
    for i, is_marked in enumerate(marked[:-1]):
        if is_marked and _FOLLOWER.fullmatch(tokens[i + 1]):
            chosen[i + 1] = True
    runs = []
    i = 0
    while i < len(tokens):
        if not chosen[i]:
            i += 1
            continue
        j = i + 1
        # A run ends at a plain word, or at a word that starts something new once the run is long: wetext's cost
        # and the alignment's grow faster than a run's length, and a spoken number is a few words long.
        while j < len(tokens) and chosen[j] and (j - i < MAX_WETEXT_RUN or not marked[j]):
            j += 1
        runs.append((i, j, marked[i:j]))
        i = j
    return runs


def _joined(pieces: Sequence[MappedText]) -> MappedText:
    """``pieces`` joined by blanks; a blank maps to what lay between its neighbours in the original."""
    parts: list[MappedText] = []
    for k, piece in enumerate(pieces):
        if k:
            end = parts[-1].source(0, len(parts[-1]))[1]
            start = piece.source(0, len(piece))[0]
            parts.append(MappedText.spanning(" ", (end, start) if end <= start else (start, start)))
        parts.append(piece)
    return MappedText.join(parts)


def _span_of(words: Sequence[MappedText]) -> Span:
    spans = [word.source(0, len(word)) for word in words]
    return min(s for s, _ in spans), max(e for _, e in spans)


def _align(words: Sequence[MappedText], marked: Sequence[bool], spoken: Sequence[str]) -> list[MappedText]:
    """wetext's words mapped onto the words it read: an unchanged word (case aside) keeps its own characters, a
    changed run takes the span of the run it replaced, an added word the span of its neighbour. A run with no
    trigger in it is wetext's word list at work on a plain word ("TV" -> "Television"): it stays as written."""
    matcher = SequenceMatcher(None, [w.text.lower() for w in words], [s.lower() for s in spoken], autojunk=False)
    pieces: list[MappedText] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pieces.extend(words[i1:i2])
        elif i1 == i2:
            anchor = words[i1 - 1] if i1 else words[i1]
            pieces.append(MappedText.spanning(" ".join(spoken[j1:j2]), _span_of([anchor])))
        elif not any(marked[i1:i2]):
            pieces.extend(words[i1:i2])
        elif j1 < j2:
            pieces.append(_replacement(_joined(words[i1:i2]), " ".join(spoken[j1:j2])))
    return pieces


def _replacement(source: MappedText, spoken: str) -> MappedText:
    """``spoken`` in place of ``source``: the punctuation both have at their edges keeps its own place ('"5' ->
    '"five': the quote is not part of the word "5"), the rest takes the span of the rest of ``source``."""
    limit = min(len(source), len(spoken))
    lead = 0
    while lead < limit and source.text[lead] == spoken[lead] and not spoken[lead].isalnum():
        lead += 1
    trail = 0
    while trail < limit - lead and source.text[-1 - trail] == spoken[-1 - trail] and not spoken[-1 - trail].isalnum():
        trail += 1
    middle = source[lead : len(source) - trail]
    if not middle.text.strip() or not spoken[lead : len(spoken) - trail].strip():
        return MappedText.spanning(spoken, _span_of([source]))
    said = MappedText.spanning(spoken[lead : len(spoken) - trail], _span_of([middle]))
    return MappedText.join([source[:lead], said, source[len(source) - trail :]])


def _read_one(word: MappedText) -> MappedText:
    """One token through wetext alone (where its run failed); else its core without the punctuation around it."""
    spoken = _wetext(word.text, "en")
    if spoken is None:
        core = re.fullmatch(r"(\W*)(.+?)(\W*)", word.text)
        if core is None or not core.group(2) or core.group(2) == word.text:
            return word
        inner = _wetext(core.group(2), "en")
        if inner is None:
            return word
        spoken = core.group(1) + inner + core.group(3)
    return word if spoken == word.text else _replacement(word, spoken)


class WetextBudget:
    """How many more wetext calls one request's text may make. wetext costs about a millisecond per character it
    reads, on the event loop; a text made of numbers and symbols would hold the loop for seconds. Past the budget,
    words are read by ``_read_plainly`` (the rules before wetext still apply), so the cost of a text is bounded and
    its reading the same on every machine."""

    def __init__(self, calls: int = MAX_WETEXT_CALLS) -> None:
        self.calls = calls

    def take(self) -> bool:
        if self.calls <= 0:
            return False
        self.calls -= 1
        return True


_DIGITS = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_SYMBOL_WORDS = {
    "&": "and",
    "%": "percent",
    "@": "at",
    "+": "plus",
    "=": "equals",
    "#": "number",
    "\u00d7": "times",
    "\u00f7": "divided by",
    "\u00b0": "degrees",
}
_SYMBOL = re.compile("[" + re.escape("".join(_SYMBOL_WORDS)) + "]")
_BLANKS = re.compile(r"\s+")


def _say_digits(match: re.Match[str]) -> str:
    whole, _, fraction = match.group(0).replace(",", "").partition(".")
    said = cardinal(int(whole)) if len(whole) <= 15 else digit_words(whole)
    return f" {said} point {digit_words(fraction)} " if fraction else f" {said} "


def _read_plainly(word: MappedText) -> MappedText:
    """A word read without wetext: numbers as cardinals, the symbols wetext would say by their names."""
    said = word.sub(_DIGITS, _say_digits).sub(_SYMBOL, lambda match: f" {_SYMBOL_WORDS[match.group(0)]} ")
    return _tidy_blanks(said)


def _tidy_blanks(mapped: MappedText) -> MappedText:
    return mapped.sub(_BLANKS, " ").strip()


def _read_english(line: MappedText, budget: WetextBudget) -> MappedText:
    runs = _windows(line)
    if not runs:
        return line
    tokens = [m.span() for m in _TOKEN.finditer(line.text)]
    parts: list[MappedText] = []
    last = 0
    for first, end, marked in runs:
        start, stop = tokens[first][0], tokens[end - 1][1]
        words = [line[a:b] for a, b in tokens[first:end]]
        if not budget.take():
            pieces = [_read_plainly(word) if is_marked else word for word, is_marked in zip(words, marked, strict=True)]
            parts += [line[last:start], _joined(pieces)]
            last = stop
            continue
        spoken = _wetext(" ".join(w.text for w in words), "en")
        if spoken is None:
            pieces = [_read_one(word) if is_marked else word for word, is_marked in zip(words, marked, strict=True)]
        else:
            pieces = _align(words, marked, spoken.split())
        parts += [line[last:start], _joined(pieces)]
        last = stop
    parts.append(line[last:])
    return MappedText.join(parts)


# -- Chinese and Japanese ---------------------------------------------------------------------------------------

_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
_TAG = re.compile(r"\[[a-z_\-]+\]|</?[a-z]+>")
"""CosyVoice2's tags ("[laughter]", "<strong>"): passed by, never through a grammar."""


def _read_cjk(line: MappedText, lang: str, budget: WetextBudget) -> MappedText:
    """A Chinese or Japanese line through wetext's grammar for it (numbers, dates, units, money; "3个" -> "三个"),
    aligned character by character, CosyVoice2's tags passed by."""
    parts: list[MappedText] = []
    last = 0
    for tag in [*_TAG.finditer(line.text), None]:
        end = tag.start() if tag else len(line.text)
        parts.append(_read_cjk_piece(line[last:end], lang, budget))
        if tag:
            parts.append(line[tag.start() : tag.end()])
            last = tag.end()
    return MappedText.join(parts)


def _read_cjk_piece(piece: MappedText, lang: str, budget: WetextBudget) -> MappedText:
    if not re.search(r"\d", piece.text) or not budget.take():
        return piece
    lead = len(piece.text) - len(piece.text.lstrip())
    body = piece[lead : lead + len(piece.text.strip())]
    spoken = _wetext(body.text, lang)
    if spoken is None or spoken == body.text:
        return piece
    parts: list[MappedText] = [piece[:lead]]
    matcher = SequenceMatcher(None, body.text, spoken, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            parts.append(body[i1:i2])
        elif j1 < j2:
            span = body.source(i1, i2) if i1 < i2 else body.source(max(i1 - 1, 0), max(i1, 1))
            parts.append(MappedText.spanning(spoken[j1:j2], span))
    parts.append(piece[lead + len(body) :])
    return MappedText.join(parts)


# -- the whole ----------------------------------------------------------------------------------------------------

_MARKUP = re.compile(r"<\|[^|<>]*\|>")


def spoken_form(mapped: MappedText, language: str, budget: WetextBudget | None = None) -> MappedText:
    """``mapped`` (cleaned text: one blank between words) as an ``language`` voice should read it, each character
    still mapped to the characters of the original it came from.

    English and "mul" text: our rules, then wetext's English grammar on the words that need it. A Chinese or
    Japanese line (CosyVoice2) goes to wetext's grammar for it; Korean is left as it is. Text with CosyVoice's
    markup (``<|en|>``) is left as it is, as CosyVoice's own front end leaves it. ``budget``: the request's wetext
    calls left (a fresh one when None)."""
    if _MARKUP.search(mapped.text):
        return mapped
    budget = budget if budget is not None else WetextBudget()
    rules = _RULES[_day_first(language)]
    lines: list[MappedText] = []
    changed = False
    start = 0
    for end in [*(i for i, c in enumerate(mapped.text) if c == "\n"), len(mapped.text)]:
        line = mapped[start:end]
        said = _spoken_line(line, rules, budget)
        changed = changed or said.text != line.text
        lines.append(said)
        if end < len(mapped.text):
            lines.append(mapped[end : end + 1])
        start = end + 1
    return MappedText.join(lines) if changed else mapped


def _spoken_line(line: MappedText, rules: Sequence[Rule], budget: WetextBudget) -> MappedText:
    if not _CANDIDATE.search(line.text):
        return line
    if _KANA.search(line.text):
        return _read_cjk(line, "ja", budget)
    if _HAN.search(line.text):
        return _read_cjk(line, "zh", budget)
    if _HANGUL.search(line.text):
        return line
    for pattern, replacement in rules:
        line = line.sub(pattern, replacement)
    return _read_english(line, budget)
