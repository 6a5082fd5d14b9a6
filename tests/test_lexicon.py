"""PLS lexicons: what the parser reads, what it refuses (hostile XML included, quickly), and how a sentence is
rewritten: whole words only, the case rules, the longest grapheme, the order of lexicons, spans kept."""

from __future__ import annotations

import time

import pytest

from rtvoice.engine.arpabet import arpabet_to_ipa
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.lexicon import (
    MAX_BYTES,
    MAX_LEXEMES,
    PLS_NAMESPACE,
    Lexeme,
    Lexicon,
    apply_lexicons,
    lexicon_applies,
    parse_pls,
)
from rtvoice.engine.mapped_text import MappedText


def pls(body: str, alphabet: str = "ipa", lang: str = "en-US", ns: bool = True) -> str:
    xmlns = f' xmlns="{PLS_NAMESPACE}"' if ns else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0"{xmlns} alphabet="{alphabet}" '
        f'xml:lang="{lang}">\n{body}\n</lexicon>'
    )


def lexicon(*lexemes: tuple[str | tuple[str, ...], str | None, str | None], language: str = "en") -> Lexicon:
    return Lexicon(
        language, tuple(Lexeme(g if isinstance(g, tuple) else (g,), phonemes, alias) for g, phonemes, alias in lexemes)
    )


# -- parsing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            pls("<lexeme><grapheme>tomato</grapheme><phoneme>təˈmɑːtoʊ</phoneme></lexeme>"),
            [Lexeme(("tomato",), "təˈmɑːtoʊ", None)],
            id="ipa",
        ),
        pytest.param(
            pls("<lexeme><grapheme>tomato</grapheme><phoneme>təˈmɑːtoʊ</phoneme></lexeme>", ns=False),
            [Lexeme(("tomato",), "təˈmɑːtoʊ", None)],
            id="no-namespace",
        ),
        pytest.param(
            f'<p:lexicon xmlns:p="{PLS_NAMESPACE}" version="1.0" alphabet="ipa" xml:lang="en-US">'
            "<p:lexeme><p:grapheme>tomato</p:grapheme><p:phoneme>təˈmɑːtoʊ</p:phoneme></p:lexeme></p:lexicon>",
            [Lexeme(("tomato",), "təˈmɑːtoʊ", None)],
            id="prefixed-namespace",
        ),
        pytest.param(
            pls("<lexeme><grapheme>W3C</grapheme><alias>World Wide Web Consortium</alias></lexeme>"),
            [Lexeme(("W3C",), None, "World Wide Web Consortium")],
            id="alias",
        ),
        pytest.param(
            pls("<lexeme><grapheme>colour</grapheme><grapheme>color</grapheme><phoneme>ˈkʌlɚ</phoneme></lexeme>"),
            [Lexeme(("colour", "color"), "ˈkʌlɚ", None)],
            id="multiple-graphemes",
        ),
        pytest.param(
            pls("<lexeme><grapheme>\n  New\n  York </grapheme><alias> Noo\tYawk </alias></lexeme>"),
            [Lexeme(("New York",), None, "Noo Yawk")],
            id="blanks-collapsed",
        ),
        pytest.param(
            pls(
                "<lexeme><grapheme>read</grapheme><phoneme>ɹiːd</phoneme><phoneme prefer='true'>ɹɛd</phoneme>"
                "<alias>reed</alias><alias prefer='true'>red</alias></lexeme>"
            ),
            [Lexeme(("read",), "ɹɛd", "red")],
            id="prefer",
        ),
        pytest.param(
            pls(
                "<lexeme><grapheme>a</grapheme><phoneme alphabet='x-sampa'>eI</phoneme><alias>ay</alias></lexeme>"
                "<lexeme><grapheme>b</grapheme><phoneme alphabet='x-sampa'>bi:</phoneme></lexeme>"
                "<lexeme><grapheme>c</grapheme><phoneme alphabet='x-sampa'>si:</phoneme><phoneme>siː</phoneme>"
                "</lexeme>"
            ),
            [Lexeme(("a",), None, "ay"), Lexeme(("c",), "siː", None)],
            id="unsupported-alphabet",
        ),
        pytest.param(
            pls(
                "<meta name='author' content='x'/><metadata><rdf xmlns='urn:x'><lexeme>not read</lexeme></rdf>"
                "</metadata><lexeme role='noun'><grapheme>a</grapheme><alias>b</alias>"
                "<example>an example</example></lexeme><x:note xmlns:x='urn:other'>ignored</x:note>"
            ),
            [Lexeme(("a",), None, "b")],
            id="metadata-and-foreign-ignored",
        ),
        pytest.param(pls(""), [], id="empty"),
    ],
)
def test_parse_pls(document: str, expected: list[Lexeme]) -> None:
    parsed = parse_pls(document)
    assert list(parsed.lexemes) == expected
    assert parsed.language == "en-US"
    assert parse_pls(document.encode("utf-8")) == parsed


def test_unsupported_lexemes_counted() -> None:
    parsed = parse_pls(pls("<lexeme><grapheme>b</grapheme><phoneme alphabet='x-sampa'>bi:</phoneme></lexeme>"))
    assert parsed.lexemes == () and parsed.ignored == 1


def test_language_is_optional() -> None:
    document = f'<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"><lexeme><grapheme>a</grapheme><alias>b</alias>'
    assert parse_pls(document + "</lexeme></lexicon>").language == ""


def test_arpabet_converted_to_ipa() -> None:
    arpabet = "T AH0 M EY1 T OW2"
    expected = arpabet_to_ipa(arpabet)
    assert "ˈ" in expected and "AH" not in expected
    for alphabet in ("cmu-arpabet", "x-cmu-arpabet", "arpabet"):
        parsed = parse_pls(pls(f"<lexeme><grapheme>tomato</grapheme><phoneme>{arpabet}</phoneme></lexeme>", alphabet))
        assert parsed.lexemes == (Lexeme(("tomato",), expected, None),)
    # A phoneme's own alphabet overrides the lexicon's, both ways.
    parsed = parse_pls(
        pls(
            f"<lexeme><grapheme>a</grapheme><phoneme alphabet='cmu-arpabet'>{arpabet}</phoneme></lexeme>"
            "<lexeme><grapheme>c</grapheme><phoneme>siː</phoneme></lexeme>"
        )
    )
    assert [lx.phonemes for lx in parsed.lexemes] == [expected, "siː"]
    parsed = parse_pls(pls("<lexeme><grapheme>c</grapheme><phoneme alphabet='ipa'>siː</phoneme></lexeme>", "arpabet"))
    assert parsed.lexemes[0].phonemes == "siː"


def test_bad_arpabet_refused() -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_pls(pls("<lexeme>\n<grapheme>a</grapheme>\n<phoneme>XX1 Q7</phoneme></lexeme>", "cmu-arpabet"))
    assert raised.value.code == "invalid_lexicon" and "line 5, column 1" in raised.value.message


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param("", "not well-formed", id="empty-input"),
        pytest.param("<lexicon><lexeme>", "not well-formed", id="unclosed"),
        pytest.param('<lexicon xmlns="urn:other"/>', "namespace", id="wrong-namespace"),
        pytest.param("<speak/>", "not <lexicon>", id="wrong-root"),
        pytest.param(pls("<lexeme><phoneme>a</phoneme></lexeme>"), "no <grapheme>", id="no-grapheme"),
        pytest.param(pls("<lexeme><grapheme>a</grapheme></lexeme>"), "neither", id="no-pronunciation"),
        pytest.param(pls("<lexeme><grapheme> </grapheme><alias>b</alias></lexeme>"), "empty", id="empty-grapheme"),
        pytest.param(pls("<grapheme>a</grapheme>"), "outside a <lexeme>", id="grapheme-outside"),
        pytest.param(pls("<lexeme><lexeme/></lexeme>"), "<lexeme> inside", id="nested-lexeme"),
        pytest.param(pls("<lexeme><grapheme>a<b/></grapheme></lexeme>"), "text only", id="element-in-grapheme"),
        pytest.param(
            pls(f"<lexeme><grapheme>{'a' * 101}</grapheme><alias>b</alias></lexeme>"), "longer", id="long-grapheme"
        ),
        pytest.param(
            "<lexicon><lexeme><grapheme>a</grapheme><phoneme>b</phoneme></lexeme></lexicon>",
            "no alphabet",
            id="phoneme-without-alphabet",
        ),
    ],
)
def test_bad_lexicons_refused(document: str, problem: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_pls(document, "my.pls", param="file")
    assert raised.value.code == "invalid_lexicon"
    assert raised.value.param == "file"
    assert problem in raised.value.message and "my.pls" in raised.value.message
    assert "line " in raised.value.message or "bytes" in raised.value.message


def test_error_names_line_and_column() -> None:
    document = pls(
        "<lexeme>\n  <grapheme>a</grapheme>\n</lexeme>\n<lexeme>\n    <grapheme></grapheme><alias>x</alias></lexeme>"
    )
    with pytest.raises(InvalidRequest) as raised:
        parse_pls(document)
    # The first lexeme lacks a pronunciation: it starts on line 3 (the XML declaration and <lexicon> come first).
    assert "line 3, column 1" in raised.value.message


_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lexicon [\n <!ENTITY lol "lol">\n'
    + "".join(f' <!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">\n' for i in range(1, 10))
    + f']>\n<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"><lexeme><grapheme>&lol9;</grapheme>'
    "<alias>x</alias></lexeme></lexicon>"
)
_EXTERNAL = (
    '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n'
    f'<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"><lexeme><grapheme>&e;</grapheme><alias>x</alias></lexeme>'
    "</lexicon>"
)
_PARAMETER = (
    '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY % p SYSTEM "http://127.0.0.1:9/evil.dtd"> %p;]>\n'
    f'<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"/>'
)
_UNPARSED = (
    '<?xml version="1.0"?>\n<!DOCTYPE x [<!NOTATION n SYSTEM "n"><!ENTITY u SYSTEM "u" NDATA n>]>\n'
    f'<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"/>'
)
_DEEP = pls("<metadata>" + "<a>" * 40 + "</a>" * 40 + "</metadata>")
_BIG = pls("<lexeme><grapheme>a</grapheme><alias>b</alias></lexeme>\n" * 20_000)
_MANY = pls("".join(f"<lexeme><grapheme>w{i}</grapheme><alias>b</alias></lexeme>" for i in range(11)))


@pytest.mark.parametrize(
    ("document", "problem", "limits"),
    [
        pytest.param(_LAUGHS, "DOCTYPE", {}, id="billion-laughs"),
        pytest.param(_EXTERNAL, "DOCTYPE", {}, id="external-entity"),
        pytest.param(_PARAMETER, "DOCTYPE", {}, id="parameter-entity"),
        pytest.param(_UNPARSED, "DOCTYPE", {}, id="unparsed-entity"),
        pytest.param(_DEEP, "deeper than 32", {}, id="too-deep"),
        pytest.param(_BIG, "at most 1000000", {}, id="too-big"),
        pytest.param(_BIG, "at most 1000", {"max_bytes": 1000}, id="too-big-custom"),
        pytest.param(_MANY, "more than 10 lexemes", {"max_lexemes": 10}, id="too-many-lexemes"),
    ],
)
def test_hostile_documents_refused_quickly(document: str, problem: str, limits: dict[str, int]) -> None:
    started = time.perf_counter()
    for data in (document, document.encode("utf-8")):
        with pytest.raises(InvalidRequest) as raised:
            parse_pls(
                data,
                max_bytes=limits.get("max_bytes", MAX_BYTES),
                max_lexemes=limits.get("max_lexemes", MAX_LEXEMES),
            )
        assert raised.value.code == "invalid_lexicon" and raised.value.param == "lexicon"
        assert problem in raised.value.message
    assert time.perf_counter() - started < 0.5


def test_entity_declaration_refused_before_anything_is_read() -> None:
    # Refused at the DOCTYPE, before any declaration is read: nothing from the file can reach the message.
    with pytest.raises(InvalidRequest) as raised:
        parse_pls(_EXTERNAL)
    assert "line 2" in raised.value.message and "passwd" not in raised.value.message


def test_external_dtd_never_read() -> None:
    """A DOCTYPE naming an external DTD (no internal subset) is read without fetching anything: an entity it
    might have declared stays unexpanded instead of pulling in a file."""
    document = (
        '<?xml version="1.0"?>\n<!DOCTYPE lexicon SYSTEM "file:///etc/passwd">\n'
        f'<lexicon xmlns="{PLS_NAMESPACE}" alphabet="ipa"><lexeme><grapheme>a&e;b</grapheme><alias>x</alias>'
        "</lexeme></lexicon>"
    )
    parsed = parse_pls(document)
    assert parsed.lexemes == (Lexeme(("ab",), None, "x"),)


def test_just_under_limits_accepted() -> None:
    parsed = parse_pls(_MANY, max_lexemes=11)
    assert len(parsed.lexemes) == 11
    parse_pls(pls("<metadata>" + "<a>" * 30 + "</a>" * 30 + "</metadata>"))  # lexicon + metadata + 30 = 32 deep


# -- applying --------------------------------------------------------------------------------------------------

TOMATO = lexicon(("tomato", "təˈmɑː toʊ", None))
NAMES = lexicon(
    ("R2-D2", None, "Artoo Detoo"),
    ("U.S.A.", None, "the States"),
    ("New York", "nuː jɔːk", "Noo Yawk"),
    ("New", None, "Nu"),
    ("US", None, "United States"),
    ("iPhone", None, "eye phone"),
)


@pytest.mark.parametrize(
    ("text", "lexicons", "phonemes", "expected", "passed_over"),
    [
        ("a tomato.", [TOMATO], True, "a [[təˈmɑːtoʊ]].", False),
        ("Tomato, TOMATO!", [TOMATO], True, "[[təˈmɑːtoʊ]], [[təˈmɑːtoʊ]]!", False),
        ("toMato ToMaTo", [TOMATO], True, "toMato ToMaTo", False),
        ("tomatoes atomato tomato2 _tomato", [TOMATO], True, "tomatoes atomato tomato2 _[[təˈmɑːtoʊ]]", False),
        ("tomato", [TOMATO], False, "tomato", True),
        ("no match", [TOMATO], False, "no match", False),
        ("R2-D2's friend", [NAMES], True, "Artoo Detoo's friend", False),
        ("XR2-D2 R2-D23 r2-d2", [NAMES], True, "XR2-D2 R2-D23 r2-d2", False),
        ("born in the U.S.A. today", [NAMES], True, "born in the the States today", False),
        ("U.S.A.B", [NAMES], True, "U.S.A.B", False),
        ("New York, New Jersey", [NAMES], False, "Noo Yawk, Nu Jersey", True),
        ("New York, New Jersey", [NAMES], True, "[[nuːjɔːk]], Nu Jersey", False),
        ("New   York", [NAMES], False, "Noo Yawk", True),
        ("New Yorker", [NAMES], False, "Nu Yorker", False),
        ("US us Us", [NAMES], True, "United States us Us", False),
        ("iPhone IPHONE iphone", [NAMES], True, "eye phone IPHONE iphone", False),
        ("café cafe\u0301", [lexicon(("cafe", None, "coffee"))], True, "café cafe\u0301", False),
        ("café", [lexicon(("café", None, "coffee"))], True, "coffee", False),
        ("", [TOMATO], True, "", False),
        ("tomato", [], True, "tomato", False),
    ],
)
def test_apply(text: str, lexicons: list[Lexicon], phonemes: bool, expected: str, passed_over: bool) -> None:
    out, passed = apply_lexicons(MappedText.of(text), lexicons, phonemes)
    assert out.text == expected
    assert passed is passed_over
    assert len(out.spans) == len(out.text)


def test_spans_map_replacements_to_the_grapheme() -> None:
    text = "I love New York and tomato!"
    out, _ = apply_lexicons(MappedText.of(text), [NAMES, TOMATO], True)
    assert out.text == "I love [[nuːjɔːk]] and [[təˈmɑːtoʊ]]!"
    start = out.text.index("[[nuː")
    assert set(out.spans[start : start + len("[[nuːjɔːk]]")]) == {(7, 15)}
    assert text[7:15] == "New York"
    start = out.text.index("[[tə")
    assert set(out.spans[start : start + len("[[təˈmɑːtoʊ]]")]) == {(20, 26)}
    # Copied characters keep their own spans.
    assert out.spans[:7] == tuple((i, i + 1) for i in range(7))
    assert out.spans[-1] == (26, 27)
    assert out.source(0, len(out)) == (0, len(text))


def test_spans_follow_an_earlier_rewrite() -> None:
    earlier = MappedText.join([MappedText.spanning("one hundred", (0, 4)), MappedText.of(" tomato", offset=4)])
    out, _ = apply_lexicons(earlier, [TOMATO], False)
    assert out is earlier
    out, _ = apply_lexicons(earlier, [lexicon(("tomato", None, "love apple"))], False)
    assert out.text == "one hundred love apple"
    assert set(out.spans[-len("love apple") :]) == {(5, 11)}
    assert set(out.spans[: len("one hundred")]) == {(0, 4)}


def test_longest_grapheme_wins() -> None:
    lex = lexicon(("New", None, "1"), ("New York City", None, "3"), ("New York", None, "2"))
    out, _ = apply_lexicons(MappedText.of("New York City, New York, New Yorkshire, New"), [lex], False)
    assert out.text == "3, 2, 1 Yorkshire, 1"
    # Across lexicons too: the longer match in the later lexicon beats the shorter one in the earlier.
    out, _ = apply_lexicons(
        MappedText.of("New York"), [lexicon(("New", None, "1")), lexicon(("New York", None, "2"))], False
    )
    assert out.text == "2"


def test_earlier_lexicon_wins_and_exact_beats_derived() -> None:
    first = lexicon(("tomato", None, "first"), ("us", None, "we"))
    second = lexicon(("tomato", None, "second"), ("US", None, "United States"))
    out, _ = apply_lexicons(MappedText.of("tomato TOMATO us US"), [first, second], False)
    assert out.text == "first first we United States"
    out, _ = apply_lexicons(MappedText.of("tomato"), [second, first], False)
    assert out.text == "second"


def test_overlapping_matches_across_lexicons() -> None:
    a = lexicon(("x y", None, "A1"), ("y z", None, "A2"))
    b = lexicon(("w x", None, "B"))
    out, _ = apply_lexicons(MappedText.of("w x y z"), [a, b], False)
    assert out.text == "B A2"  # "x y" loses to the earlier "w x"; "y z" after it still matches
    out, _ = apply_lexicons(MappedText.of("x y z"), [a, b], False)
    assert out.text == "A1 z"


def test_phoneme_without_alias_left_unchanged_and_reported() -> None:
    lex = lexicon(("Nguyen", "ŋwiən", None), ("Siobhan", "ʃɪˈvɔːn", "Shivawn"), ("GIF", None, "jif"))
    out, passed = apply_lexicons(MappedText.of("GIF by Nguyen"), [lex], False)
    assert (out.text, passed) == ("jif by Nguyen", True)
    out, passed = apply_lexicons(MappedText.of("Siobhan"), [lex], False)
    assert (out.text, passed) == ("Shivawn", True)
    out, passed = apply_lexicons(MappedText.of("GIF"), [lex], False)
    assert (out.text, passed) == ("jif", False)
    out, passed = apply_lexicons(MappedText.of("Siobhan"), [lex], True)
    assert (out.text, passed) == ("[[ʃɪˈvɔːn]]", False)


def test_parsed_lexicon_applies_end_to_end() -> None:
    parsed = parse_pls(
        pls(
            "<lexeme><grapheme>GIF</grapheme><phoneme alphabet='cmu-arpabet'>JH IH1 F</phoneme></lexeme>"
            "<lexeme><grapheme>SQL</grapheme><alias>sequel</alias></lexeme>"
        )
    )
    out, passed = apply_lexicons(MappedText.of("A GIF in SQL."), [parsed], True)
    assert out.text == f"A [[{arpabet_to_ipa('JH IH1 F')}]] in sequel." and not passed


def test_hand_built_graphemes_normalised() -> None:
    lex = lexicon(("", None, "never"), ("  ", None, "never"), (" New  York ", None, "NYC"))
    out, _ = apply_lexicons(MappedText.of("in New\n\tYork now"), [lex], False)
    assert out.text == "in NYC now"


def test_matcher_is_built_once() -> None:
    lex = lexicon(("a", None, "b"))
    assert lex.matcher() is lex.matcher()
    assert lex == lexicon(("a", None, "b"))  # the cache is no part of the lexicon's value


@pytest.mark.parametrize(
    ("lexicon_language", "voice_language", "applies"),
    [
        ("", "de_DE", True),
        ("en-US", "en_US", True),
        ("en-US", "en-GB", True),
        ("en-US", "en", True),
        ("EN-us", "en_GB", True),
        ("en", "en-US", True),
        ("en-US", "de_DE", False),
        ("de", "en", False),
        ("en-US", "mul", True),
        ("fr", "", True),
    ],
)
def test_lexicon_applies(lexicon_language: str, voice_language: str, applies: bool) -> None:
    assert lexicon_applies(Lexicon(lexicon_language, ()), voice_language) is applies


def test_a_pronunciation_a_voice_cannot_take_is_reported_and_its_alias_used() -> None:
    from rtvoice.engine.ssml import MarkupRules
    from rtvoice.engine.text import Segment, Segmenter

    lexicons = [lexicon(("tomato", "təˈmɑːtoʊ", None), ("W3C", None, "World Wide Web Consortium"))]
    for reads_phonemes, reported in ((True, False), (False, True)):
        segmenter = Segmenter(90, 300, rules=MarkupRules(reads_phonemes=reads_phonemes), lexicons=lexicons)
        planned = segmenter.push("A tomato from the W3C.") + segmenter.close()
        text = " ".join(item.text for item in planned if isinstance(item, Segment))
        assert ("[[təˈmɑːtoʊ]]" in text) is reads_phonemes and "World Wide Web Consortium" in text
        assert any("lexicon" in what for what in segmenter.ignored) is reported
