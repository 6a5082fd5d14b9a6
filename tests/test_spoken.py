"""The spoken form (engine/spoken.py through engine/text.py's ``normalize``): what each kind of written thing is said
as, what is left alone, and that every word still maps to the characters the client wrote."""

from __future__ import annotations

import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rtvoice.engine import spoken
from rtvoice.engine.text import make_segment, normalize, normalize_mapped

READINGS = {
    "cardinals": [
        ("I have 3 cats.", "I have three cats."),
        ("There are 42 of them.", "There are forty two of them."),
        ("It has 1,000 rows.", "It has one thousand rows."),
        ("It has 1,250 rows.", "It has one thousand two hundred fifty rows."),
        ("It has 123,456 rows.", "It has one hundred twenty three thousand four hundred fifty six rows."),
        ("It has 1,000,000 rows.", "It has one million rows."),
        ("We paid 1250 dollars.", "We paid one thousand two hundred fifty dollars."),
        ("About 1500 people came.", "About one thousand five hundred people came."),
        ("Room 101 is free.", "Room one hundred one is free."),
        ("Call 911 now.", "Call nine one one now."),
        ("It was -5 outside.", "It was negative five outside."),
    ],
    "decimals": [
        ("Pi is 3.14.", "Pi is three point one four."),
        ("It grew 0.5 points.", "It grew zero point five points."),
        ("It is 1250.5 long.", "It is one thousand two hundred fifty point five long."),
        ("Version 2.0.1 is out.", "Version two point zero point one is out."),
    ],
    "money": [
        ("It costs $5.", "It costs five dollars."),
        ("It costs $1.", "It costs one dollar."),
        ("It costs $1.50.", "It costs one dollar and fifty cents."),
        ("It costs $1,250.75.", "It costs one thousand two hundred fifty dollars and seventy five cents."),
        ("It costs $0.99.", "It costs ninety nine cents."),
        ("It costs $5.00.", "It costs five dollars."),
        ("It costs $3.5 today.", "It costs three dollars and fifty cents today."),
        ("They raised $3.2 million.", "They raised three point two million dollars."),
        ("They raised $5M.", "They raised five million dollars."),
        ("They raised $1.2bn.", "They raised one point two billion dollars."),
        ("It costs $5-$10.", "It costs five dollars to ten dollars."),
        ("It costs \u00a31.50.", "It costs one pound and fifty pence."),
        ("It costs \u00a30.01.", "It costs one penny."),
        ("It costs \u20ac2.05.", "It costs two euros and five cents."),
        ("It costs \u20ac1 million.", "It costs one million euros."),
        ("It costs \u00a5500.", "It costs five hundred yen."),
        ("Pay 50\u00a2 now.", "Pay fifty cents now."),
    ],
    "percentages": [
        ("Prices rose 5.5% last year.", "Prices rose five point five percent last year."),
        ("Give 110% effort.", "Give one hundred ten percent effort."),
        ("It is 50 % off.", "It is fifty percent off."),
    ],
    "numeric dates": [
        ("Born on 07/04/1990.", "Born on July fourth, nineteen ninety."),
        ("On 12/25/2024 we rest.", "On December twenty fifth, twenty twenty four we rest."),
        ("On 25/12/2024 we rest.", "On December twenty fifth, twenty twenty four we rest."),  # no 25th month
        ("On 2024-05-01 we start.", "On May first, twenty twenty four we start."),
        ("On 04.07.1990 we met.", "On July fourth, nineteen ninety we met."),  # dots: day first
        ("Due 3/4/05.", "Due March fourth, oh five."),
    ],
    "written dates": [
        ("On July 4, 1990 it rained.", "On July fourth, nineteen ninety it rained."),
        ("Open May 5, closed Dec. 25.", "Open May fifth, closed December twenty fifth."),
        ("It was Jan. 5th.", "It was January fifth."),
        ("On 4 July 1990 it rained.", "On the fourth of July, nineteen ninety it rained."),
        ("We met on the 4th of July.", "We met on the fourth of July."),
        ("I was born in May 1990.", "I was born in May nineteen ninety."),
    ],
    "years": [
        ("In 1990 we moved.", "In nineteen ninety we moved."),
        ("In 2005 we moved.", "In two thousand five we moved."),
        ("In 2024 we moved.", "In twenty twenty four we moved."),
        ("In 1905 we moved.", "In nineteen oh five we moved."),
        ("The 2024 elections.", "The twenty twenty four elections."),
        ("It ran 1990-95.", "It ran nineteen ninety to ninety five."),
        ("From 1990\u20132000.", "From nineteen ninety to two thousand."),
        ("The 1990s were loud.", "The nineteen nineties were loud."),
        ("The 1800s were slow.", "The eighteen hundreds were slow."),
        ("The 90s were loud.", "The nineties were loud."),
    ],
    "12 h times": [
        ("Meet me at 10:45 a.m. today.", "Meet me at ten forty five A M today."),
        ("Meet me at 7:30 pm.", "Meet me at seven thirty P M."),
        ("Meet me at 7 PM tonight.", "Meet me at seven P M tonight."),
        ("Wake at 6am.", "Wake at six A M."),
        ("Leave at 5 p.m. Then rest.", "Leave at five P M. Then rest."),
        ("It starts at 9:05.", "It starts at nine o five."),
        ("It's 5 o'clock.", "It's five o'clock."),
    ],
    "24 h times": [
        ("It leaves at 18:20.", "It leaves at eighteen twenty."),
        ("It ends at 23:59.", "It ends at twenty three fifty nine."),
    ],
    "ordinals": [
        ("The 21st century.", "The twenty first century."),
        ("She was 2nd and he was 3rd.", "She was second and he was third."),
        ("The 100th time.", "The one hundredth time."),
        ("A 1st-class seat.", "A first-class seat."),
    ],
    "fractions": [
        ("Add 1/2 cup.", "Add one half cup."),
        ("Add 3/4 cup and 2 1/2 cups.", "Add three quarters cup and two and a half cups."),
        ("Open 24/7.", "Open twenty four seven."),
    ],
    "units": [
        ("Store at 72\u00b0F or 20\u00b0C.", "Store at seventy two degrees Fahrenheit or twenty degrees Celsius."),
        ("It weighs 5 kg.", "It weighs five kilograms."),
        ("It is 3 m long.", "It is three meters long."),
        ("Drive 100 km/h.", "Drive one hundred kilometers per hour."),
        ("Drive 60 mph.", "Drive sixty miles per hour."),
        ("She ran 5km in 25 min.", "She ran five kilometers in twenty five minutes."),
        ("Add 2 tbsp. of sugar.", "Add two tablespoons of sugar."),
        ("Add 1 tsp salt and 1/2 tsp pepper.", "Add one teaspoon salt and one half teaspoon pepper."),
        ("Use 3 oz. of cheese.", "Use three ounces of cheese."),
        ("Bring 2 lbs. of flour and 1 lb. of butter.", "Bring two pounds of flour and one pound of butter."),
        ("Wait 2 hrs.", "Wait two hours."),
        ("Wait 5 min. Then go.", "Wait five minutes. Then go."),
        ("He is 6'2\" tall.", "He is six feet two inches tall."),
    ],
    "roman numerals in context": [
        ("Read Chapter IV tonight.", "Read Chapter four tonight."),
        ("Part III, Volume II.", "Part three, Volume two."),
        ("Act V, Scene I.", "Act five, Scene one."),
        ("Part I of it.", "Part one of it."),
        ("After World War II and WWI.", "After World War two and World War one."),
        ("Henry VIII had six wives.", "Henry the Eighth had six wives."),
        ("Louis XIV built it.", "Louis the Fourteenth built it."),
        ("Pope John Paul II visited.", "Pope John Paul the Second visited."),
        ("Elizabeth I.", "Elizabeth the First."),
        ("King Tut II ruled.", "King Tut the Second ruled."),
    ],
    "abbreviations": [
        ("Dr. Smith met Mr. and Mrs. Jones and Ms. Lee.", "Doctor Smith met Mister and Missus Jones and Miz Lee."),
        ("Prof. Jones, Jr. arrived.", "Professor Jones, Junior arrived."),
        ("We flew to St. Louis.", "We flew to Saint Louis."),
        ("He lives at 12 Main St.", "He lives at twelve Main Street."),
        ("He lives on Elm St. now.", "He lives on Elm Street now."),
        ("Fruit, e.g. apples, i.e. food.", "Fruit, for example apples, that is food."),
        ("Apples, pears, etc. are fruit.", "Apples, pears, etcetera are fruit."),
        ("Apples, pears, etc.", "Apples, pears, etcetera."),
        ("Apples, pears, etc. Then more.", "Apples, pears, etcetera. Then more."),
        ("Cats vs. dogs.", "Cats versus dogs."),
        ("It is approx. 5 km.", "It is approximately five kilometers."),
        ("It is No. 5.", "It is number five."),
        ("It is #1.", "It is number one."),
    ],
    "phone numbers": [
        ("Call 555-123-4567.", "Call five five five, one two three, four five six seven."),
        ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
        ("Call 1-800-555-0199.", "Call one, eight hundred, five five five, zero one nine nine."),
        ("Call +44 20 7946 0958.", "Call plus four four, two zero, seven nine four six, zero nine five eight."),
    ],
    "e-mail and URLs": [
        ("Write to info@example.org now.", "Write to info at example dot org now."),
        ("Visit example.com today.", "Visit example dot com today."),
        (
            "See https://www.example.com/path now.",
            "See HTTPS colon slash slash WWW dot example dot com slash path now.",
        ),
    ],
    "symbols and acronyms": [
        ("Tom & Jerry.", "Tom and Jerry."),
        ("It scored +5 points.", "It scored plus five points."),
        ("It took ~5 days.", "It took about five days."),
        ("The FBI and NASA met.", "The FBI and NASA met."),
        ("It's 2x faster.", "It's two times faster."),
        ("Take I-95 to COVID-19 tests.", "Take I-ninety five to COVID-nineteen tests."),
    ],
}


@pytest.mark.parametrize(
    ("written", "said"),
    [pair for pairs in READINGS.values() for pair in pairs],
    ids=[f"{kind}: {w}" for kind, pairs in READINGS.items() for w, _ in pairs],
)
def test_spoken_form(written: str, said: str) -> None:
    assert normalize(written, "en_US") == said


LEFT_AS_WRITTEN = [
    "MIX CIVIL DID a thing.",  # words of Roman numeral letters
    "I am here and I know it.",  # the pronoun
    "The part I like is the scene I saw.",  # context words, but the pronoun after them
    "Then I told Henry I was tired.",  # a regnal name, then the pronoun
    "The U.S. has TV, yes.",  # wetext's word list never touches words without numbers
    "He said no. Then he left.",
]


@pytest.mark.parametrize("text", LEFT_AS_WRITTEN)
def test_out_of_context_words_are_left_as_written(text: str) -> None:
    assert normalize(text) == text


def test_wetext_word_list_leaves_plain_words_next_to_numbers() -> None:
    assert normalize("The U.S. has 50 states and TV.") == "The U.S. has fifty states and TV."
    assert normalize("I watched TV for 5 hours.") == "I watched TV for five hours."


def test_quotes_and_brackets_survive_wetext() -> None:
    assert normalize('He said "5 dogs" ran.') == 'He said "five dogs" ran.'  # wetext writes \"
    assert normalize("See [5] and (6).") == "See [five] and (six)."  # wetext fails on "[5]" as a whole
    assert normalize("C:\\temp has 5 files.") == "C:\\temp has five files."


def test_day_first_english() -> None:
    assert normalize("Born on 07/04/1990.", "en_GB") == "Born on the seventh of April, nineteen ninety."
    assert normalize("Born on 07/04/1990.", "en-us") == "Born on July fourth, nineteen ninety."


def test_lines_stay_lines() -> None:
    assert normalize("Buy 3 apples\nand 2 pears.") == "Buy three apples\nand two pears."


# -- Chinese, Japanese, markup (CosyVoice2's "mul") ----------------------------------------------------------


def test_chinese_and_japanese_numbers() -> None:
    assert normalize("我有3个苹果，价格是12.5元。", "mul") == "我有三个苹果，价格是十二点五元。"
    assert normalize("今日は2024年5月1日です。", "mul") == "今日は二千二十四年五月一日です。"
    assert normalize("[laughter]我有3个苹果", "mul") == "[laughter]我有三个苹果"


def test_markup_is_left_as_written() -> None:
    assert normalize("<|en|>Call 911 now.", "mul") == "<|en|>Call 911 now."
    assert normalize("[breath] I have 3 cats.", "mul") == "[breath] I have three cats."


def test_other_languages_are_only_cleaned() -> None:
    assert normalize("Ich habe 3 Katzen, Dr. Müller.", "de") == "Ich habe 3 Katzen, Dr. Müller."


def test_spoken_false_only_cleans() -> None:
    assert normalize("Dr. Smith paid $5  now.", spoken=False) == "Dr. Smith paid $5 now."
    segment = make_segment("It costs $5.", 0, "en", spoken=False)
    assert segment.text == "It costs $5." and [w.text for w in segment.words] == ["It", "costs", "$5"]


# -- number words ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (15, "fifteen"),
        (42, "forty two"),
        (100, "one hundred"),
        (1250, "one thousand two hundred fifty"),
        (2_000_017, "two million seventeen"),
    ],
)
def test_cardinal(n: int, words: str) -> None:
    assert spoken.cardinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (12, "twelfth"),
        (20, "twentieth"),
        (21, "twenty first"),
        (100, "one hundredth"),
    ],
)
def test_ordinal(n: int, words: str) -> None:
    assert spoken.ordinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1066, "ten sixty six"),
        (1900, "nineteen hundred"),
        (1905, "nineteen oh five"),
        (2000, "two thousand"),
        (2009, "two thousand nine"),
        (2010, "twenty ten"),
        (1000, "one thousand"),
    ],
)
def test_year(n: int, words: str) -> None:
    assert spoken.year(n) == words


def test_roman_values() -> None:
    assert [spoken.roman_value(n) for n in ("I", "IV", "IX", "XIV", "XL", "LVII", "XCIX", "CXC")] == [
        1,
        4,
        9,
        14,
        40,
        57,
        99,
        190,
    ]


# -- spans: each word maps to what the client wrote ----------------------------------------------------------


def words_of(raw: str, language: str = "en", offset: int = 0) -> list[tuple[str, str]]:
    """Each word of ``raw``'s segment: (what the client wrote, what the voice reads)."""
    segment = make_segment(raw, offset, language)
    assert all(raw[w.start - offset : w.end - offset] == w.text for w in segment.words)
    return [(w.text, segment.text[w.spoken_start : w.spoken_end]) for w in segment.words]


def test_money_maps_to_what_was_written() -> None:
    assert words_of("It costs $5 today.") == [
        ("It", "It"),
        ("costs", "costs"),
        ("$5", "five dollars"),
        ("today", "today"),
    ]
    assert words_of("Only $1,250.75!")[1] == (
        "$1,250.75",
        "one thousand two hundred fifty dollars and seventy five cents",
    )


def test_offsets_count_in_all_the_text() -> None:
    segment = make_segment("Pay $5 now.", 100, "en")
    money = segment.words[1]
    assert (money.text, money.start, money.end) == ("$5", 104, 106)
    assert segment.text[money.spoken_start : money.spoken_end] == "five dollars"


def test_each_part_of_a_date_maps_to_its_number() -> None:
    assert words_of("Born 07/04/1990 here.") == [
        ("Born", "Born"),
        ("07", "July"),
        ("04", "fourth"),
        ("1990", "nineteen ninety"),
        ("here", "here"),
    ]
    assert words_of("On July 4, 1990.")[1:] == [("July", "July"), ("4", "fourth"), ("1990", "nineteen ninety")]


def test_wetext_words_map_to_their_tokens() -> None:
    assert words_of('He said "5 dogs" ate 1,250 treats.') == [
        ("He", "He"),
        ("said", "said"),
        ("5", "five"),
        ("dogs", "dogs"),
        ("ate", "ate"),
        ("1,250", "one thousand two hundred fifty"),
        ("treats", "treats"),
    ]
    assert words_of("Meet at 10:45 a.m., ok?") == [
        ("Meet", "Meet"),
        ("at", "at"),
        ("10:45", "ten forty five"),
        ("a.m.", "A M"),
        ("ok", "ok"),
    ]
    assert words_of("It weighs 5 kg.")[-1] == ("5 kg", "five kilograms")
    assert words_of("Mail bob@example.com now.")[1:] == [("bob@example.com", "bob at example dot com"), ("now", "now")]


def test_rules_map_their_words() -> None:
    assert words_of("Henry VIII said.") == [("Henry", "Henry"), ("VIII", "the Eighth"), ("said", "said")]
    assert words_of("Add 2 tbsp. now.") == [("Add", "Add"), ("2", "two"), ("tbsp.", "tablespoons"), ("now", "now")]
    assert words_of("Dr. Who") == [("Dr.", "Doctor"), ("Who", "Who")]


def test_chinese_maps_to_its_characters() -> None:
    assert words_of("我有3个苹果。", "mul") == [("我有3个苹果。", "我有三个苹果。")]
    mapped = normalize_mapped("我有3个", "mul")
    three = mapped.text.index("三")
    assert mapped.source(three, three + 1) == (2, 3)


# -- plain text: as before, and fast ---------------------------------------------------------------------------

PLAIN = [
    "My sister bought a small house near the river last summer.",
    "Please call me back before five o'clock tomorrow afternoon.",
    "\u201cWell,\u201d she said \u2014 and paused \u2026 \u201cI don\u2019t know.\u201d",
    "When the committee finally gathered in the old library, everyone expected a short meeting.",
    "I think, therefore I am.",
    "Caf\u0065\u0301 au lait, s'il vous pla\u00eet!",
]


def cleaned_only(text: str) -> str:
    """What normalisation made of plain text before the spoken form: unicode, quotes, blanks."""
    return normalize(text, spoken=False)


@pytest.mark.parametrize("text", PLAIN)
def test_plain_text_is_unchanged(text: str) -> None:
    assert normalize(text) == cleaned_only(text)
    assert normalize_mapped(text) == normalize_mapped(text, spoken=False)


def test_plain_text_skips_wetext(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(text: str, lang: str) -> str:
        raise AssertionError(f"wetext called for {text!r}")

    monkeypatch.setattr(spoken, "_wetext", fail)
    for text in [*PLAIN, "Dr. Smith met Henry VIII on St. Patrick's day, e.g. at noon."]:
        normalize(text)


MIXED = [
    "It costs $1,250.75 to fly on 07/04/1990 at 10:45 a.m.",
    "Add 2 tbsp. of sugar and 3/4 cup of milk at 350\u00b0F.",
    "Henry VIII was born in 1491 and had 6 wives.",
    "Call 555-123-4567 or mail info@example.com before 5 p.m.",
    "Prices rose 5.5% in 2023, about $3.2 million in all.",
    "Dr. Smith lives at 12 Main St. and drives 60 mph.",
]


def test_one_normaliser_shared_by_threads() -> None:
    """wetext's normaliser is made once; it keeps nothing between calls, so threads get what one thread gets."""
    assert spoken._normalizer("en") is spoken._normalizer("en")
    expected = [normalize(text) for text in MIXED]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(normalize, MIXED * 8))
    assert results == expected * 8


def test_timing() -> None:
    """Mixed sentences a few milliseconds each (wetext: about 1 ms a run); plain ones a small fraction of that."""
    normalize(MIXED[0])  # wetext's grammars load once (about 0.5 s)

    def median_ms(texts: list[str]) -> float:
        times = []
        for _ in range(5):
            for text in texts:
                started = time.perf_counter()
                normalize_mapped(text)
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    assert median_ms(MIXED) < 15
    assert median_ms(PLAIN) < 1


def test_a_text_of_numbers_and_symbols_costs_a_bounded_number_of_wetext_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from rtvoice.engine.text import Segment, Segmenter

    calls: list[str] = []
    original = spoken._wetext

    def counted(text: str, lang: str) -> str | None:
        calls.append(text)
        return original(text, lang)

    monkeypatch.setattr(spoken, "_wetext", counted)  # counts the real calls; the reading stays wetext's
    for text in ("a & " * 1000, "1 " * 2000, " ".join(str(n) for n in range(900))):
        calls.clear()
        segmenter = Segmenter(90, 300)
        planned = segmenter.push(text) + segmenter.close()
        said = " ".join(item.text for item in planned if isinstance(item, Segment))
        assert len(calls) == spoken.MAX_WETEXT_CALLS
        assert all(len(call.split()) <= 2 * spoken.MAX_WETEXT_RUN for call in calls)
        # Past the budget the words are still read: no digit or "&" is left for the phonemiser.
        assert not re.search(r"[\d&]", said), said[-200:]
    assert said.endswith("eight hundred ninety eight eight hundred ninety nine")
    budget = spoken.WetextBudget(1)
    assert budget.take() and not budget.take()
