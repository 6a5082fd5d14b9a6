"""Word timings from the engine: spans in the client's text, exact Piper times in the output time base, and how
close they are to an independent forced aligner (PocketSphinx) on the embedded voice."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from itertools import pairwise

import numpy as np
import pytest

from rtvoice.engine.audio.pcm import to_float32, to_int16
from rtvoice.engine.audio.resample import resample
from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.models.piper.session import PiperSession
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.stream import AudioChunk, MarkTiming, SegmentDone, WordTiming
from rtvoice.engine.text import Segmenter
from testkit.alignment import ALIGNER_RATE, SENTENCES, forced_alignment, speak
from tests.audio import same_speech
from tests.engine_output import reference_engine

TEXT = "It costs $100, Dr. Smith said. Then we walked home, e.g. past the old mill, at 5 o'clock."
SAMPLE_EDGE_S = 0.002
"""A word may end this close past the audio (the resampler's last samples are rounded)."""


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    loop = asyncio.new_event_loop()
    engine = reference_engine()
    loop.run_until_complete(engine.start())
    engine.loop = loop  # type: ignore[attr-defined]
    yield engine
    loop.run_until_complete(engine.stop())
    loop.close()


def run(engine: Engine, coroutine):  # type: ignore[no-untyped-def]
    return engine.loop.run_until_complete(coroutine)  # type: ignore[attr-defined]


async def events(
    engine: Engine, text: str | list[str], seed: int = 1, sample_rate: int | None = None, speed: float = 1.0
) -> list[object]:
    """Every event of one stream; ``text`` as a list is pushed fragment by fragment."""
    options = SynthesisOptions(seed=seed, speed=speed)
    if isinstance(text, str):
        stream = engine.open_stream(SynthesisRequest(text=text, options=options, sample_rate=sample_rate, words=True))
    else:
        stream = engine.open_stream(SynthesisRequest(options=options, sample_rate=sample_rate, words=True))
        for fragment in text:
            stream.push_text(fragment)
        stream.close_input()
    return [event async for event in stream.events()]


def words_of(received: list[object]) -> list[WordTiming]:
    return [event for event in received if isinstance(event, WordTiming)]


def audio_s(received: list[object]) -> float:
    chunks = [event for event in received if isinstance(event, AudioChunk)]
    return sum(len(c.pcm) for c in chunks) / chunks[0].sample_rate


# -- spans in the client's text ---------------------------------------------------------------------


def test_words_map_back_to_what_the_client_wrote() -> None:
    text = "\u201cDr. Who\u201d paid $100.50 \u2014 i.e. a lot \u2026 at 3.5% for caf\u0065\u0301s!"
    segmenter = Segmenter(90, 300)
    segments = segmenter.push(text) + segmenter.flush()
    words = [word for segment in segments for word in segment.words]
    assert [w.text for w in words] == [
        "Dr.",
        "Who",
        "paid",
        "$100.50",
        "i.e.",
        "a",
        "lot",
        "at",
        "3.5%",
        "for",
        "cafe\u0301s",
    ]
    assert all(text[w.start : w.end] == w.text for w in words)
    money = words[3]
    assert segments[0].text[money.spoken_start : money.spoken_end] == "one hundred dollars and fifty cents"


def test_fragments_give_the_same_words_with_offsets_in_the_whole_text() -> None:
    whole = Segmenter(90, 300)
    expected = [(w.text, w.start, w.end) for s in whole.push(TEXT) + whole.flush() for w in s.words]
    pieces = Segmenter(90, 300)
    got = []
    for i in range(0, len(TEXT), 2):  # an LLM's tokens
        got += [(w.text, w.start, w.end) for s in pieces.push(TEXT[i : i + 2]) for w in s.words]
    got += [(w.text, w.start, w.end) for s in pieces.flush() for w in s.words]
    assert got == expected
    assert [t for t, _, _ in got][:3] == ["It", "costs", "$100"] and all(TEXT[a:b] == t for t, a, b in got)


# -- times ------------------------------------------------------------------------------------------


def test_words_are_ordered_inside_the_audio_and_before_it(engine: Engine) -> None:
    received = run(engine, events(engine, TEXT))
    words = words_of(received)
    assert [w.text for w in words] == [
        "It",
        "costs",
        "$100",
        "Dr.",
        "Smith",
        "said",
        "Then",
        "we",
        "walked",
        "home",
        "e.g.",
        "past",
        "the",
        "old",
        "mill",
        "at",
        "5",
        "o'clock",
    ]
    assert all(TEXT[w.start : w.end] == w.text and not w.approximate for w in words)
    total = audio_s(received)
    for before, after in pairwise(words):
        assert before.start_s <= after.start_s and before.end_s <= after.end_s + 1e-9
    assert all(0 <= w.start_s < w.end_s <= total + SAMPLE_EDGE_S for w in words)
    # Each word comes before the chunk that holds its start, and after the chunks that end before it.
    sent = 0.0
    for event in received:
        if isinstance(event, AudioChunk):
            sent += event.duration_s
        elif isinstance(event, WordTiming):
            assert sent <= event.start_s + 1e-9, f"{event.text} came after its audio"
    following = [next((e for e in received[received.index(w) :] if isinstance(e, AudioChunk)), None) for w in words]
    assert all(chunk is not None for chunk in following)


def test_a_stream_that_sends_no_words_times_nothing_and_sounds_the_same(engine: Engine) -> None:
    """A transport that sends no words (``SynthesisRequest.words`` False) gets neither words nor marks, its voice
    works out no token timings before its first audio, and its audio is the same speech (chunk sizes follow the
    costs measured at the moment, so two runs match up to the rounding where chunks join)."""
    text = '<speak>It costs $100. <mark name="m"/>Then <break time="200ms"/>we walked home.</speak>'

    async def spoken(words: bool) -> tuple[list[object], PiperSession]:
        request = SynthesisRequest(text=text, options=SynthesisOptions(seed=4), words=words)
        stream = engine.open_stream(request)
        assert isinstance(stream.session, PiperSession)
        return [event async for event in stream.events()], stream.session

    timed, _ = run(engine, spoken(True))
    untimed, session = run(engine, spoken(False))
    assert words_of(timed) and any(isinstance(e, MarkTiming) for e in timed)
    assert not [e for e in untimed if isinstance(e, (WordTiming, MarkTiming))]
    assert session.timings == []  # the encoder's results carried no token timings
    pcm = [np.concatenate([e.pcm for e in got if isinstance(e, AudioChunk)]) for got in (timed, untimed)]
    assert len(pcm[0]) > 16_000 and same_speech(pcm[1], pcm[0])


def test_resampled_rates_give_the_same_times(engine: Engine) -> None:
    native = words_of(run(engine, events(engine, TEXT)))
    for rate in (8000, 48000):
        resampled = words_of(run(engine, events(engine, TEXT, sample_rate=rate)))
        assert [(w.text, w.start) for w in resampled] == [(w.text, w.start) for w in native]
        assert np.allclose([w.start_s for w in resampled], [w.start_s for w in native], atol=1e-6)
        assert np.allclose([w.end_s for w in resampled], [w.end_s for w in native], atol=1e-6)


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_speed_scales_the_times(engine: Engine, speed: float) -> None:
    normal = run(engine, events(engine, TEXT))
    changed = run(engine, events(engine, TEXT, speed=speed))
    ratio = audio_s(changed) / audio_s(normal)
    # A sentence has 1/speed of its frames (engine/models/piper/pace.py); the second's durations are another draw,
    # since the first's noise took another number of frames from the stream's generator.
    assert ratio == pytest.approx(1 / speed, rel=0.05)
    # Each word sits at about the same place in the audio, scaled: a one-frame token does not shrink, so a word moves
    # by a few hundredths of the length (where the client hears it: the forced-alignment test below).
    for a, b in zip(words_of(normal), words_of(changed), strict=True):
        assert b.start_s / audio_s(changed) == pytest.approx(a.start_s / audio_s(normal), abs=0.05), a.text


def test_later_segments_are_offset_by_the_audio_before_them(engine: Engine) -> None:
    received = run(engine, events(engine, TEXT))
    sent = 0.0
    segment_ends = []
    for event in received:
        if isinstance(event, AudioChunk):
            sent += event.duration_s
        elif isinstance(event, SegmentDone):
            segment_ends.append(sent)
    words = words_of(received)
    then = next(w for w in words if w.text == "Then")
    assert len(segment_ends) >= 2 and then.start_s >= segment_ends[0] - 0.01  # the resampler holds a few ms back
    said = next(w for w in words if w.text == "said")
    assert said.end_s <= segment_ends[0] + SAMPLE_EDGE_S


def test_text_sent_token_by_token_gets_spans_in_the_concatenated_text(engine: Engine) -> None:
    tokens = [TEXT[i : i + 3] for i in range(0, len(TEXT), 3)]
    words = words_of(run(engine, events(engine, tokens)))
    whole = words_of(run(engine, events(engine, TEXT)))
    assert [(w.text, w.start, w.end) for w in words] == [(w.text, w.start, w.end) for w in whole]
    assert all("".join(tokens)[w.start : w.end] == w.text for w in words)


# -- against an independent aligner -----------------------------------------------------------------

MAX_SENTENCE_MAE_S = 0.08
"""The target: word starts within 80 ms (mean absolute error) of the forced alignment; about 30-40 ms measured
(bench/word_timing.py), where spreading words by characters is off by about 190 ms."""


def test_word_starts_are_close_to_a_forced_alignment(engine: Engine) -> None:
    all_errors = []
    for text, spoken in SENTENCES:
        pcm, words = run(engine, speak(engine, text, seed=3))
        aligned = forced_alignment(pcm, spoken.split("|"))
        assert len(words) == len(aligned)
        errors = [abs(w.start_s - a) for w, a in zip(words, aligned, strict=True)]
        assert statistics.fmean(errors) <= MAX_SENTENCE_MAE_S, (text, errors)
        all_errors += errors
    assert statistics.fmean(all_errors) <= MAX_SENTENCE_MAE_S * 0.75


def test_segments_joined_are_close_to_a_forced_alignment(engine: Engine) -> None:
    """Two sentences in one request: the second segment's words are offset by the first one's audio."""
    (first, first_spoken), (second, second_spoken) = SENTENCES[0], SENTENCES[4]
    pcm, words = run(engine, speak(engine, f"{first} {second}", seed=5))
    aligned = forced_alignment(pcm, first_spoken.split("|") + second_spoken.split("|"))
    later = words[len(first_spoken.split("|")) :]
    errors = [abs(w.start_s - a) for w, a in zip(later, aligned[-len(later) :], strict=True)]
    assert later[0].start_s > len(pcm) / ALIGNER_RATE / 3
    assert statistics.fmean(errors) <= MAX_SENTENCE_MAE_S, errors


@pytest.mark.parametrize(("speed", "rate"), [(1.6, ALIGNER_RATE), (0.7, 48_000)])
def test_speed_and_rate_keep_word_starts_where_the_client_hears_them(engine: Engine, speed: float, rate: int) -> None:
    """Faster or slower, at another rate than the voice's: each word starts where an independent aligner hears it
    in the audio the client receives (times in the output's time base: speed and resampling included)."""
    errors = []
    for text, spoken in SENTENCES[:3]:
        pcm, words = run(engine, speak(engine, text, seed=4, sample_rate=rate, speed=speed))
        assert words[-1].end_s <= len(pcm) / rate + SAMPLE_EDGE_S
        heard = pcm if rate == ALIGNER_RATE else to_int16(resample(to_float32(pcm), rate, ALIGNER_RATE))
        aligned = forced_alignment(heard, spoken.split("|"))
        assert len(words) == len(aligned)
        errors += [abs(w.start_s - a) for w, a in zip(words, aligned, strict=True)]
    assert statistics.fmean(errors) <= MAX_SENTENCE_MAE_S, [round(e, 3) for e in errors]
