import pytest

from rtvoice.engine.text import Segmenter, is_speakable, normalize, segment

LONG = (
    "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone expected "
    "a short meeting, but the discussion about the new budget, the delayed construction of the bridge, and the "
    "future of the community garden went on for hours."
)


def test_sentences_and_abbreviations() -> None:
    text = "Dr. Smith paid $3.50 on Jan. 5th! Version 3.5 is out. J. R. R. Tolkien wrote it, e.g. in 1937."
    assert segment(text, 90, 300) == [
        "Doctor Smith paid three dollars and fifty cents on January fifth!",
        "Version three point five is out.",
        "J. R. R. Tolkien wrote it, for example in nineteen thirty seven.",
    ]


def test_long_first_sentence_is_cut_at_a_clause() -> None:
    segments = segment(LONG, 90, 300)
    assert segments[0] == "When the committee finally gathered in the old library on a rainy Thursday afternoon,"
    assert all(len(s) <= 300 for s in segments)
    assert " ".join(segments) == LONG


def test_word_boundary_when_no_clause() -> None:
    text = " ".join(["word"] * 60)
    segments = segment(text, 40, 100)
    assert len(segments[0]) <= 40 and all(len(s) <= 100 for s in segments)
    assert " ".join(segments) == text


@pytest.mark.parametrize("first_clause_chars", [0, 24])
def test_fragments_give_the_same_segments_as_whole_text(first_clause_chars: int) -> None:
    text = (
        "Well then, if you insist, I will pay 1,000 dollars. "
        + LONG
        + " Dr. Who? Yes! Numbers like 3.14 stay whole.\n\nA new paragraph"
    )
    segmenter = Segmenter(90, 300, first_clause_chars=first_clause_chars)
    pieces: list[str] = []
    for i in range(0, len(text), 3):  # an LLM's few characters at a time
        pieces += [piece.text for piece in segmenter.push(text[i : i + 3])]
    pieces += [piece.text for piece in segmenter.flush()]
    assert pieces == segment(text, 90, 300, first_clause_chars=first_clause_chars)
    if first_clause_chars:
        assert pieces[:2] == ["Well then, if you insist,", "I will pay one thousand dollars."]


def test_first_segment_ends_at_its_first_clause_past_the_threshold() -> None:
    text = "If that time does not suit you, I can move it to Friday, or to Monday. Later, shorter, clauses stay whole."
    assert segment(text, 90, 300, first_clause_chars=24) == [
        "If that time does not suit you,",
        "I can move it to Friday, or to Monday.",
        "Later, shorter, clauses stay whole.",
    ]
    assert segment(text, 90, 300, first_clause_chars=0)[0] == (
        "If that time does not suit you, I can move it to Friday, or to Monday."
    )
    # A clause shorter than the threshold is no place to cut; a sentence that ends first is its own segment.
    assert segment("Yes, of course, I can help you with that booking today.", 90, 300, first_clause_chars=24) == [
        "Yes, of course, I can help you with that booking today."
    ]
    assert segment("Thanks for calling. I can help you, of course.", 90, 300, first_clause_chars=10)[0] == (
        "Thanks for calling."
    )


def test_first_clause_waits_for_what_follows_its_mark() -> None:
    segmenter = Segmenter(90, 300, first_clause_chars=5)
    assert segmenter.push("It costs 1,") == []  # may still be 1,000
    assert segmenter.push("000 dollars, ") == []  # may still be "1,000 dollars, 50 cents"
    assert [piece.text for piece in segmenter.push("or so they say, and")] == ["It costs one thousand dollars,"]
    assert [piece.text for piece in segmenter.flush()] == ["or so they say, and"]  # later segments: sentences


def test_no_clause_cut_falls_inside_a_date_or_number() -> None:
    segmenter = Segmenter(90, 300, first_clause_chars=5)
    assert segmenter.push("We met on January 5, ") == []
    assert segmenter.push("2027 at noon, ") == []
    assert [piece.text for piece in segmenter.push("then left.")] == [
        "We met on January fifth, twenty twenty seven at noon,"
    ]


def test_sentence_waits_for_what_follows_its_terminator() -> None:
    segmenter = Segmenter(90, 300)
    assert segmenter.push("It costs 3.") == []
    assert [piece.text for piece in segmenter.push("5 dollars. Then")] == ["It costs three point five dollars."]
    assert [piece.text for piece in segmenter.flush()] == ["Then"]


def test_normalize_and_speakable() -> None:
    assert normalize("\u201cHi\u201d \u2014 there\x07  now") == '"Hi", there now'
    assert not is_speakable(" ...!? ")
    assert is_speakable("42")


def test_a_number_split_across_pieces_is_read_whole() -> None:
    segmenter = Segmenter(90, 300, first_clause_chars=5)
    assert segmenter.push("It costs $1,2") == []
    assert [piece.text for piece in segmenter.push("50.75, all told. ")] == [
        "It costs one thousand two hundred fifty dollars and seventy five cents,",
        "all told.",
    ]
