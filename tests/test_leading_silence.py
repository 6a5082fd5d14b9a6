"""A live player's stream drops the voice's silence before its first sound; the words move with the audio."""

from __future__ import annotations

import asyncio

import numpy as np

from rtvoice.engine.audio.pcm import leading_silence
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.output import MAX_TRIMMED_S, ONSET_LEAD_S, SILENCE_THRESHOLD
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.stream import AudioChunk, WordTiming
from tests.audio import same_speech
from tests.engine_output import reference_engine

TEXT = "Hello! How can I help you today?"
RATE = 48000


def test_leading_silence_counts_quiet_samples() -> None:
    pcm = np.array([0, 3, -3, 0, 40, 0, 500], dtype=np.int16)
    assert leading_silence(pcm, 40) == 4
    assert leading_silence(pcm, 501) == len(pcm)
    assert leading_silence(pcm[:0], 1) == 0


def _synthesize(trim: bool) -> tuple[np.ndarray, list[WordTiming]]:
    async def run() -> tuple[np.ndarray, list[WordTiming]]:
        engine = reference_engine()
        await engine.start()
        try:
            stream = engine.open_stream(
                SynthesisRequest(
                    text=TEXT,
                    options=SynthesisOptions(seed=7),
                    sample_rate=RATE,
                    trim_leading_silence=trim,
                    words=True,
                )
            )
            events = [event async for event in stream.events()]
        finally:
            await engine.stop()
        pcm = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
        return pcm, [e for e in events if isinstance(e, WordTiming)]

    return asyncio.run(run())


def test_trimmed_stream_is_the_same_speech_from_its_first_sound() -> None:
    whole, whole_words = _synthesize(trim=False)
    trimmed, trimmed_words = _synthesize(trim=True)
    dropped = len(whole) - len(trimmed)
    first_sound = leading_silence(whole, SILENCE_THRESHOLD)
    # The embedded voice starts with silence; all of it goes but a short lead before the first sound.
    assert 0 < first_sound < MAX_TRIMMED_S * RATE
    # Where a sample at the threshold rounds the other way in the other run, its first sound moves a little.
    assert abs(dropped - (first_sound - round(ONSET_LEAD_S * RATE))) <= RATE // 1000
    # The two runs' chunk plans follow the times measured as they run, so their decoder windows can fall apart by a
    # frame and float rounding moves samples by a step or two (212 samples in 88,607 in a parallel run): the same
    # speech from the first sound on, to that rounding.
    assert same_speech(trimmed, whole[dropped:])
    assert [w.text for w in trimmed_words] == [w.text for w in whole_words]
    for moved, original in zip(trimmed_words, whole_words, strict=True):
        assert moved.start_s == max(0.0, original.start_s - dropped / RATE)
        assert moved.end_s == max(0.0, original.end_s - dropped / RATE)
