"""Word timings checked against an independent forced aligner (PocketSphinx, its own en-US acoustic model and
dictionary): the aligner, the sentences it is run on (the text as a client sends it, and its words as spoken), and
the engine's audio and word timings for a text. Shared by tests/test_word_timing.py, the agent-framework tests and
``bench.word_timing``."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.stream import AudioChunk, WordTiming

ALIGNER_RATE = 16_000
ALIGNER_FRAME_S = 0.01
"""PocketSphinx counts in 10 ms frames."""

SENTENCES: list[tuple[str, str]] = [
    # The text as a client sends it, and its words as spoken, one "|"-separated group per word.
    ("It costs $100, Dr. Smith said.", "it|costs|one hundred dollars|doctor|smith|said"),
    (
        "I went to the store in the morning and bought 3 apples.",
        "i|went|to|the|store|in|the|morning|and|bought|three|apples",
    ),
    (
        "The meeting starts at 9 on Monday, e.g. right after breakfast.",
        "the|meeting|starts|at|nine|on|monday|for example|right|after|breakfast",
    ),
    (
        "Prices rose 25% in 2023 & fell again.",
        "prices|rose|twenty five percent|in|twenty twenty three|and|fell|again",
    ),
    (
        "Please call me back before five o'clock tomorrow afternoon.",
        "please|call|me|back|before|five|o'clock|tomorrow|afternoon",
    ),
    (
        "My sister bought a small house near the river last summer.",
        "my|sister|bought|a|small|house|near|the|river|last|summer",
    ),
]


def to_aligner(pcm: np.ndarray, rate: int) -> np.ndarray:
    """int16 ``pcm`` at ``rate`` resampled (soxr) to the recogniser's 16 kHz."""
    import soxr

    return soxr.resample(pcm, rate, ALIGNER_RATE).astype(np.int16)


def transcribe(pcm: np.ndarray) -> list[str]:
    """The words PocketSphinx's US English model hears in 16 kHz int16 ``pcm`` (a free recogniser: what it hears
    is evidence, its misses are not)."""
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=ALIGNER_RATE, loglevel="ERROR")
    decoder.start_utt()
    decoder.process_raw(pcm.astype("<i2").tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return [] if hypothesis is None else str(hypothesis.hypstr).split()


def heard_as(pcm: np.ndarray, choices: Sequence[str]) -> str | None:
    """Which of ``choices`` (each words of PocketSphinx's dictionary, blank-separated: ``"code is m a p"`` against
    ``"code is map"``) its US English model finds in 16 kHz int16 ``pcm``, searching a grammar of just those; None
    when it finds none. A choice between readings is evidence where a free transcription of short words is not."""
    from pocketsphinx import Decoder

    grammar = "#JSGF V1.0;\ngrammar choice;\npublic <choice> = " + " | ".join(f"( {c} )" for c in choices) + " ;\n"
    decoder = Decoder(samprate=ALIGNER_RATE, lm=None, loglevel="ERROR")
    decoder.add_jsgf_string("choice", grammar)
    decoder.activate_search("choice")
    decoder.start_utt()
    decoder.process_raw(pcm.astype("<i2").tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return None if hypothesis is None else str(hypothesis.hypstr)


def forced_alignment(pcm: np.ndarray, groups: Sequence[str]) -> list[float]:
    """Start (seconds) of each group of spoken words in 16 kHz int16 ``pcm``, by PocketSphinx's forced alignment."""
    from pocketsphinx import Decoder

    decoder = Decoder(lm=None, loglevel="ERROR")
    decoder.set_align_text(" ".join(groups))
    decoder.start_utt()
    decoder.process_raw(pcm.astype("<i2").tobytes(), full_utt=True)
    decoder.end_utt()
    aligned = [
        (re.sub(r"\(\d+\)$", "", seg.word), seg.start_frame * ALIGNER_FRAME_S)
        for seg in decoder.seg()
        if seg.word not in ("<s>", "</s>", "<sil>") and not seg.word.startswith("+")
    ]
    spoken = " ".join(groups).split()
    if [word for word, _ in aligned] != spoken:
        raise RuntimeError(f"the aligner returned {[w for w, _ in aligned]}, not {spoken}")
    starts: list[float] = []
    index = 0
    for group in groups:
        starts.append(aligned[index][1])
        index += len(group.split())
    return starts


async def speak(
    engine: Engine, text: str, seed: int, sample_rate: int = ALIGNER_RATE, speed: float = 1.0
) -> tuple[np.ndarray, list[WordTiming]]:
    """The engine's audio and word timings for ``text``."""
    stream = engine.open_stream(
        SynthesisRequest(
            text=text, options=SynthesisOptions(seed=seed, speed=speed), sample_rate=sample_rate, words=True
        )
    )
    chunks: list[np.ndarray] = []
    words: list[WordTiming] = []
    async for event in stream.events():
        if isinstance(event, AudioChunk):
            chunks.append(event.pcm)
        elif isinstance(event, WordTiming):
            words.append(event)
    return np.concatenate(chunks), words
