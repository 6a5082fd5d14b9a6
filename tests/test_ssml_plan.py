"""SSML and inline tags into a request's plan: segments (text, rate, gain), pauses and marks, per dialect.

The documents are written from each vendor's own documentation of its SSML (W3C SSML 1.1, Amazon Polly, Azure,
Google Cloud, ElevenLabs, Cartesia) and from what LLMs write into markup."""

from __future__ import annotations

import time

import pytest

from rtvoice.engine.markup import MarkupError
from rtvoice.engine.ssml import MarkupRules, detect
from rtvoice.engine.text import Segment, Segmenter, Silence

PIPER = MarkupRules(reads_phonemes=True)
CARTESIA = MarkupRules(inline_tags="cartesia")

Planned = tuple[str, str | float, float]
"""("say", text, rate), ("pause", seconds, 0), ("gain", text, gain)."""


def plan(text: str, rules: MarkupRules | None = None, piece: int = 0) -> list[Segment | Silence]:
    """The segments and silences of ``text``, pushed whole or ``piece`` characters at a time."""
    segmenter = Segmenter(90, 300, rules=rules)
    out: list[Segment | Silence] = []
    if piece:
        for i in range(0, len(text), piece):
            out += segmenter.push(text[i : i + piece])
    else:
        out += segmenter.push(text)
    return out + segmenter.close()


def summary(items: list[Segment | Silence]) -> list[Planned]:
    out: list[Planned] = []
    for item in items:
        if isinstance(item, Silence):
            out.append(("pause", round(item.seconds, 3), 0.0))
        else:
            out.append(("say", item.text, round(item.prosody.rate, 3)))
    return out


def said(text: str, rules: MarkupRules | None = None) -> str:
    return " ".join(item.text for item in plan(text, rules) if isinstance(item, Segment))


# -- the W3C subset -----------------------------------------------------------------------------------------------

W3C_TABLE: list[tuple[str, list[Planned]]] = [
    (
        '<speak>The first part is done.<break time="1200ms"/>The second part starts now.</speak>',
        [("say", "The first part is done.", 1.0), ("pause", 1.2, 0), ("say", "The second part starts now.", 1.0)],
    ),
    ('<speak>Wait<break time="2s"/>go.</speak>', [("say", "Wait", 1.0), ("pause", 2.0, 0), ("say", "go.", 1.0)]),
    ('<speak>A<break strength="x-strong"/>b.</speak>', [("say", "A", 1.0), ("pause", 1.25, 0), ("say", "b.", 1.0)]),
    ('<speak>A<break strength="none"/>b.</speak>', [("say", "A b.", 1.0)]),
    ("<speak>A<break/>b.</speak>", [("say", "A", 1.0), ("pause", 0.75, 0), ("say", "b.", 1.0)]),
    (
        '<speak><prosody rate="slow">Slowly.</prosody> <prosody rate="150%">Quickly.</prosody></speak>',
        [("say", "Slowly.", 0.64), ("say", "Quickly.", 1.5)],
    ),
    (
        '<speak><prosody rate="x-fast">Fast <prosody rate="50%">then half.</prosody></prosody></speak>',
        [("say", "Fast", 2.0), ("say", "then half.", 1.0)],
    ),
    (
        '<speak><sub alias="World Wide Web Consortium">W3C</sub> rules.</speak>',
        [("say", "World Wide Web Consortium rules.", 1.0)],
    ),
    ('<speak><say-as interpret-as="characters">SSML</say-as>.</speak>', [("say", "ess ess em ell.", 1.0)]),
    ('<speak><say-as interpret-as="spell-out">abc</say-as></speak>', [("say", "eigh bee see", 1.0)]),
    (
        '<speak><say-as interpret-as="cardinal">12345</say-as></speak>',
        [("say", "twelve thousand three hundred forty five", 1.0)],
    ),
    ('<speak><say-as interpret-as="ordinal">3</say-as> place</speak>', [("say", "third place", 1.0)]),
    ('<speak>PIN <say-as interpret-as="digits">1234</say-as></speak>', [("say", "PIN one two three four", 1.0)]),
    (
        '<speak><say-as interpret-as="date" format="mdy">12/25/2026</say-as></speak>',
        [("say", "December twenty fifth twenty twenty six", 1.0)],
    ),
    (
        '<speak><say-as interpret-as="date" format="dmy">25/12/2026</say-as></speak>',
        [("say", "the twenty fifth of December twenty twenty six", 1.0)],
    ),
    ('<speak><say-as interpret-as="time">2:30pm</say-as></speak>', [("say", "two thirty PM", 1.0)]),
    (
        '<speak><say-as interpret-as="telephone">555-0199</say-as></speak>',
        [("say", "five five five, zero one nine nine", 1.0)],
    ),
    (
        "<speak><p><s>One.</s><s>Two</s></p><p>Three</p></speak>",
        [("say", "One.", 1.0), ("say", "Two", 1.0), ("say", "Three", 1.0)],
    ),
    (
        '<speak><emphasis level="strong">Really</emphasis> <lang xml:lang="fr-FR">bonjour</lang>.</speak>',
        [("say", "Really bonjour.", 1.0)],
    ),
    ("<speak>Tom &amp; Jerry &lt;3 &#233;t&#xE9;</speak>", [("say", "Tom and Jerry <three \u00e9t\u00e9", 1.0)]),
    ("<speak>Is 3 &lt; 5?</speak>", [("say", "Is three less than five?", 1.0)]),
    ("<speak><unknown-thing>Its text</unknown-thing> is read.</speak>", [("say", "Its text is read.", 1.0)]),
]


@pytest.mark.parametrize("ssml,expected", W3C_TABLE, ids=[doc[:40] for doc, _ in W3C_TABLE])
def test_w3c_ssml_plans(ssml: str, expected: list[Planned]) -> None:
    assert summary(plan(ssml)) == expected
    assert summary(plan(ssml, piece=3)) == expected  # pushed in pieces, the same plan


def test_prosody_volume_is_a_gain_per_segment() -> None:
    items = plan(
        '<speak>Normal. <prosody volume="-6dB">Softer.</prosody> <prosody volume="x-loud">Loud.</prosody></speak>'
    )
    gains = [round(item.prosody.volume, 3) for item in items if isinstance(item, Segment)]
    assert gains == [1.0, round(10 ** (-6 / 20), 3), round(10 ** (10 / 20), 3)]


def test_phoneme_becomes_piper_phonemes_and_its_word_maps_to_the_content() -> None:
    ssml = '<speak>I say <phoneme alphabet="ipa" ph="p\u0259\u02c8te\u026a\u027eo\u028a">tomato</phoneme>.</speak>'
    (segment,) = plan(ssml, PIPER)
    assert isinstance(segment, Segment)
    assert segment.text == "I say [[p\u0259\u02c8te\u026a\u027eo\u028a]]."
    word = segment.words[-1]
    assert (word.text, ssml[word.start : word.end]) == ("tomato", "tomato")
    # A voice without phoneme input reads the word, and says it did.
    segmenter = Segmenter(90, 300)
    assert [s.text for s in segmenter.push(ssml) + segmenter.close() if isinstance(s, Segment)] == ["I say tomato."]
    assert any("phoneme" in what for what in segmenter.ignored)


def test_an_alias_is_what_word_timings_report_and_points_at_its_element() -> None:
    ssml = '<speak>Ask <sub alias="World Wide Web">WWW</sub> now.</speak>'
    (segment,) = plan(ssml)
    assert isinstance(segment, Segment)
    words = [(w.text, ssml[w.start : w.end]) for w in segment.words]
    assert words == [
        ("Ask", "Ask"),
        ("World Wide Web", '<sub alias="World Wide Web">WWW</sub>'),
        ("now", "now"),
    ]


def test_spelled_letters_map_to_their_own_characters() -> None:
    ssml = '<speak>Code <say-as interpret-as="characters">XK9</say-as></speak>'
    (segment,) = plan(ssml)
    assert isinstance(segment, Segment)
    assert [(w.text, w.start) for w in segment.words][1:] == [
        ("X", ssml.index("XK9")),
        ("K", ssml.index("XK9") + 1),
        ("9", ssml.index("XK9") + 2),
    ]


def test_a_mark_stands_before_the_word_after_it() -> None:
    ssml = '<speak>Hello <mark name="here"/>world. <mark name="end"/></speak>'
    items = plan(ssml)
    segment = items[0]
    assert isinstance(segment, Segment)
    (mark,) = segment.marks
    assert (mark.name, segment.words[mark.word].text, mark.position) == ("here", "world", ssml.index("<mark"))
    last = items[-1]  # a mark after the last word: reached where the audio ends
    assert isinstance(last, Silence) and last.seconds == 0 and [m.name for m in last.marks] == ["end"]


# -- what is SSML, and what stays text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,mode",
    [
        ("<speak>Hi</speak>", "ssml"),
        ("   \n<SPEAK>Hi</SPEAK>", "ssml"),
        ('<?xml version="1.0" encoding="UTF-8"?>\n<speak version="1.1">Hi</speak>', "ssml"),
        ("<!-- greeting --><speak>Hi</speak>", "ssml"),
        (
            '<!DOCTYPE speak PUBLIC "-//W3C//DTD SYNTHESIS 1.0//EN" '
            '"http://www.w3.org/TR/speech-synthesis/synthesis.dtd"><speak>Hi</speak>',
            "ssml",
        ),
        ("Is 3 < 5?", "plain"),
        ("<b>bold</b> text", "plain"),
        ("List<String> names", "plain"),
        ("Hello <speak>", "plain"),
    ],
)
def test_detection(text: str, mode: str) -> None:
    assert detect(text, final=True) == mode


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Is 3 < 5?", [("say", "Is three less than five?", 1.0)]),
        (
            'Hold on.<break time="1.5s"/>Go.',  # ElevenLabs' inline break in plain text
            [("say", "Hold on.", 1.0), ("pause", 1.5, 0), ("say", "Go.", 1.0)],
        ),
        ("Write List<String> here.", [("say", "Write List<String> here.", 1.0)]),
        ("Mail <bob@example.com> now.", [("say", "Mail bob at example dot com now.", 1.0)]),
        ("Fish & chips.", [("say", "Fish and chips.", 1.0)]),
        ("<speak>Forced text</speak>", [("say", "<speak>Forced text</speak>", 1.0)]),
    ],
)
def test_plain_text_stays_text_but_for_inline_breaks(text: str, expected: list[Planned]) -> None:
    rules = MarkupRules(text_type="text") if text.startswith("<speak") else None
    assert summary(plan(text, rules)) == expected


@pytest.mark.parametrize("piece", [0, 1, 2, 3, 5])
def test_markdown_in_ssml_is_not_read_in_any_pieces(piece: int) -> None:
    document = (
        '<speak>This is **very** good. **Really <emphasis>very</emphasis>**, (*so*) "__much__".\n'
        "* first item\n+ second item\nBut 5 * 3 and a*b stay.</speak>"
    )
    assert said_in_pieces(document, piece) == (
        'This is very good. Really very, (so) "much". first item second item But five * three and a*b stay.'
    )


def said_in_pieces(text: str, piece: int) -> str:
    return " ".join(item.text for item in plan(text, piece=piece) if isinstance(item, Segment))


def test_a_byte_order_mark_before_the_root_is_a_prolog() -> None:
    document = "\ufeff<speak>Hi<break time='1s'/>there</speak>"
    assert detect(document, final=True) == "ssml"
    assert summary(plan(document)) == [("say", "Hi", 1.0), ("pause", 1.0, 0), ("say", "there", 1.0)]


@pytest.mark.parametrize(
    "text",
    ["<speak>Hello <break time=1s/> friend</speak>", "Hello <break time=1s/> friend", "Hello <BREAK TIME=1s> friend"],
)
def test_unquoted_attribute_values_are_read(text: str) -> None:
    assert summary(plan(text)) == [("say", "Hello", 1.0), ("pause", 1.0, 0), ("say", "friend", 1.0)]


@pytest.mark.parametrize("time,seconds", [("2", 2.0), ("15", 10.0), ("99.5", 10.0), ("100", 0.1), ("500", 0.5)])
def test_a_break_time_without_a_unit_is_seconds_when_small_else_milliseconds(time: str, seconds: float) -> None:
    assert summary(plan(f'<speak>A<break time="{time}"/>b</speak>')) == [
        ("say", "A", 1.0),
        ("pause", seconds, 0),
        ("say", "b", 1.0),
    ]


def test_forced_ssml_needs_no_root() -> None:
    assert summary(plan('One<break time="1s"/>two', MarkupRules(text_type="ssml"))) == [
        ("say", "One", 1.0),
        ("pause", 1.0, 0),
        ("say", "two", 1.0),
    ]


# -- vendors' dialects (issue 40) ----------------------------------------------------------------------------------

DIALECTS: list[tuple[str, str, str, list[float]]] = [
    # (dialect, document, what is said, pauses)
    (
        "amazon",
        '<speak>Hi. <amazon:effect name="whispered">A secret.</amazon:effect> '
        '<amazon:domain name="news">News.</amazon:domain><break time="500ms"/></speak>',
        "Hi. A secret. News.",
        [0.5],
    ),
    (
        "amazon-breath",
        '<speak>Deep<amazon:breath duration="long" volume="x-loud"/> breath.</speak>',
        "Deep breath.",
        [],
    ),
    (
        "azure",
        '<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
        'xmlns:mstts="https://www.w3.org/2001/mstts" xml:lang="en-US">'
        '<voice name="en-US-AvaNeural"><mstts:express-as style="cheerful">Great news</mstts:express-as>'
        '<bookmark mark="flag"/> today. <say-as interpret-as="number_digit">42</say-as></voice></speak>',
        "Great news today. four two",
        [],
    ),
    (
        "google",
        '<speak><google:style name="lively">Welcome</google:style> to <say-as interpret-as="verbatim">abc</say-as>'
        '<break time="0.5s"/><audio src="https://example.com/chime.mp3">ding<desc>a chime</desc></audio></speak>',
        "Welcome to eigh bee see ding",
        [0.5],
    ),
    (
        "elevenlabs",
        '<speak>Say <phoneme alphabet="cmu-arpabet" ph="T AH0 M EY1 T OW2">tomato</phoneme>.'
        '<break time="1.5s" /></speak>',
        "Say tomato.",
        [1.5],
    ),
    ("uppercase", '<SPEAK>One<BREAK TIME="300MS"/>two</SPEAK>', "One two", [0.3]),
    ("bare-number", '<speak>One<break time="2"/>two<break time="500"/>three</speak>', "One two three", [2.0, 0.5]),
    ("in-a-row", '<speak>One<break time="1s"/><break time="500ms"/>two</speak>', "One two", [1.5]),
    ("at-the-start", '<speak><break time="1s"/>Then speech.</speak>', "Then speech.", [1.0]),
    (
        "llm",
        "<speak>Q&A about R&D &mdash; it&rsquo;s **really** fine &nbsp;&amp; 3 < 5.</speak>",
        "Q and A about R and D, it's really fine and three less than five.",
        [],
    ),
    ("bad-time", '<speak>One<break time="NaN"/>two<break time="-3s"/>three</speak>', "One two three", [0.75, 0.75]),
    # A "<" that cannot start a tag (a name, then prose or a comma, not an attribute) is text, read as written.
    ("llm-comparison", "<speak>if a<b then c</speak>", "if a<b then c", []),
    ("llm-generics", "<speak>Use Map<String, Int> here</speak>", "Use Map<String, Int> here", []),
    ("llm-apostrophe", "<speak>it's a<b isn't it<break time='1s'/>done</speak>", "it's a<b isn't it done", [1.0]),
    ("llm-end-tag", "<speak>x</b y> z</speak>", "x</b y> z", []),
]


@pytest.mark.parametrize("dialect,ssml,spoken,pauses", DIALECTS, ids=[d[0] for d in DIALECTS])
def test_vendor_dialects(dialect: str, ssml: str, spoken: str, pauses: list[float]) -> None:
    items = plan(ssml)
    assert said(ssml) == spoken
    assert [round(item.seconds, 3) for item in items if isinstance(item, Silence) and item.seconds] == pauses
    for word in ("amazon", "mstts", "google", "speak", "voice", "chime", "effect", "whispered", "*"):
        assert word not in said(ssml).lower(), word  # no prefix, attribute value or <desc> is read


@pytest.mark.parametrize("piece", [0, 1, 3])
def test_a_lt_read_as_text_maps_its_words_into_the_text_as_sent(piece: int) -> None:
    ssml = "<speak>If a<b then Map<String, Int> here.<break time='1s'/>Done.</speak>"
    items = plan(ssml, piece=piece)
    words = [
        (word.text, ssml[word.start : word.end]) for item in items if isinstance(item, Segment) for word in item.words
    ]
    assert words == [
        ("If", "If"),
        ("a<b", "a<b"),
        ("then", "then"),
        ("Map<String", "Map<String"),
        ("Int", "Int"),
        ("here", "here"),
        ("Done", "Done"),
    ]


def test_prosody_rates_as_vendors_write_them() -> None:
    items = plan(
        '<speak><prosody rate="1.5">One.</prosody> <prosody rate="+40%">Two.</prosody> '
        '<prosody rate="-10%">Three.</prosody></speak>'
    )
    assert summary(items) == [("say", "One.", 1.5), ("say", "Two.", 1.4), ("say", "Three.", 0.9)]


def test_azure_bookmark_is_a_mark() -> None:
    ssml = '<speak>Hello <bookmark mark="x"/>world.</speak>'
    (segment,) = plan(ssml)
    assert isinstance(segment, Segment)
    (mark,) = segment.marks
    assert (mark.name, segment.words[mark.word].text, mark.position) == ("x", "world", ssml.index("<bookmark"))


@pytest.mark.parametrize("piece", [0, 2])
def test_a_comment_inside_speak_is_not_spoken(piece: int) -> None:
    ssml = "<speak>Hello <!-- say nothing of this --> world.</speak>"
    assert said_in_pieces(ssml, piece) == "Hello world."


def test_any_default_namespace_and_version_are_accepted() -> None:
    ssml = '<speak version="0.9" xmlns="urn:example:not-ssml" xml:lang="en-GB">Hi <break time="1s"/>there.</speak>'
    assert summary(plan(ssml)) == [("say", "Hi", 1.0), ("pause", 1.0, 0), ("say", "there.", 1.0)]


def test_cartesia_inline_tags() -> None:
    text = (
        'Hello <emotion value="excited"/>there. <speed ratio="1.5"/>Fast now. <volume ratio="0.5"/>Quiet. '
        "<spell>ABC</spell>"
    )
    items = plan(text, CARTESIA, piece=2)  # tags split across transcripts wait for their ends
    segments = [item for item in items if isinstance(item, Segment)]
    assert [(s.text, s.prosody.rate, s.prosody.volume) for s in segments] == [
        ("Hello there.", 1.0, 1.0),
        ("Fast now.", 1.5, 1.0),
        ("Quiet.", 1.5, 0.5),
        ("eigh bee see", 1.5, 0.5),
    ]
    # Elsewhere the same tags are text, but for the break.
    assert "emotion" in said(text)


# -- what is refused ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ssml,problem",
    [
        ("<speak>unclosed <break time=", "never closed"),
        ("<speak>Unclosed <prosody rate='slow'>text</speak>", "closes <prosody>"),
        ("<speak><p>x</s></speak>", "closes <p>"),
        ("<speak>Text", "<speak> is never closed"),
        ("<speak>x</speak> and after", "after the document"),
        ('<speak><break time="1s" time="2s"/></speak>', "twice"),
        ('<speak><break time=="1s"/></speak>', "malformed attribute"),
        ("<speak>A <break strength/> b</speak>", "malformed attribute"),
        ('<speak>a<b c="d" e</speak>', "malformed attribute"),  # past its first attribute, a tag: not prose
        # A well-formed tag is markup even where a programmer meant a generic: an element never closed, a 400.
        ("<speak>List<String></speak>", "</speak> closes <string>"),
        ("<speak>Use <T> here", "<t> is never closed"),
        ('<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><speak>&lol2;</speak>', "DOCTYPE"),
        (
            '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><speak>&xxe;</speak>',
            "DOCTYPE",
        ),
        ('<!DOCTYPE speak SYSTEM "http://evil.example/x.dtd"><speak>x</speak>', "DTD"),
        ("<speak>" + "<s>" * 40 + "deep" + "</s>" * 40 + "</speak>", "deeper"),
        ('<speak><break time="' + "9" * 5000 + '"/></speak>', "longer than"),
        ('<speak><break time="' + "9" * 3000 + '"/></speak>', "longer than 2048"),  # within the text limit
    ],
)
def test_bad_ssml_is_refused_with_its_position(ssml: str, problem: str) -> None:
    started = time.monotonic()
    with pytest.raises(MarkupError) as raised:
        plan(ssml)
    assert problem in raised.value.message and 0 <= raised.value.position < len(ssml)
    assert time.monotonic() - started < 0.5


def test_undeclared_entities_are_text_and_references_to_no_character_say_nothing() -> None:
    # No declaration is ever read, so "&T;" names nothing: it is what an LLM wrote ("AT&T; R&D").
    assert said("<speak>AT&T; and R&D; &#0;&#xD800;&#99999999;done</speak>") == "AT and T; and R and D; done"


def test_silence_is_capped_per_break_and_per_request() -> None:
    rules = MarkupRules(max_break_s=10, max_silence_s=60)
    one = plan('<speak>A<break time="1h"/>b</speak>', rules)  # an hour is not a time: the default break
    assert [item.seconds for item in one if isinstance(item, Silence)] == [0.75]
    long = plan('<speak>A<break time="30s"/>b</speak>', rules)
    assert [item.seconds for item in long if isinstance(item, Silence)] == [10.0]
    many = plan("<speak>" + "word <break time='5s'/> " * 300 + "</speak>", rules)
    assert sum(item.seconds for item in many if isinstance(item, Silence)) == pytest.approx(60.0)


def test_extreme_and_nested_rates_are_clamped() -> None:
    items = plan('<speak><prosody rate="1000%"><prosody rate="1000%">fast</prosody></prosody></speak>')
    assert [item.prosody.rate for item in items if isinstance(item, Segment)] == [4.0]
    items = plan('<speak><prosody rate="1%">slow</prosody></speak>')
    assert [item.prosody.rate for item in items if isinstance(item, Segment)] == [0.25]
