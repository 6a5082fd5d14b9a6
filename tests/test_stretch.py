"""WSOLA time stretching (``engine/audio/stretch.py``): length, pitch and level kept, the same in pieces as whole."""

from __future__ import annotations

import numpy as np
import pytest

from rtvoice.engine.audio.stretch import TimeStretch
from tests.audio import dominant_frequency, rms

RATE = 24_000


def vowel(seconds: float = 2.0) -> np.ndarray:
    """A voiced sound: a 180 Hz fundamental and its harmonics, slowly varying in level."""
    t = np.arange(round(seconds * RATE)) / RATE
    tone = sum(np.sin(2 * np.pi * 180 * k * t) / k for k in range(1, 6))
    return (0.3 * tone * (0.75 + 0.25 * np.sin(2 * np.pi * 1.5 * t))).astype(np.float32)


@pytest.mark.parametrize("rate", [0.5, 0.64, 1.25, 1.5, 2.0])
def test_length_follows_the_rate_and_pitch_and_level_stay(rate: float) -> None:
    audio = vowel()
    out = TimeStretch(rate, RATE).process(audio, last=True)
    assert len(out) == round(len(audio) / rate)
    assert dominant_frequency(out, RATE) == pytest.approx(180, abs=3)
    middle = out[RATE // 10 : -RATE // 10]
    assert rms(middle) == pytest.approx(rms(audio[RATE // 10 : -RATE // 10]), rel=0.1)


@pytest.mark.parametrize("piece", [1, 97, 480, 5000])
def test_pieces_give_the_same_audio_as_the_whole(piece: int) -> None:
    audio = vowel(0.5)
    whole = TimeStretch(1.5, RATE).process(audio, last=True)
    stretch = TimeStretch(1.5, RATE)
    parts = [stretch.process(audio[i : i + piece]) for i in range(0, len(audio), piece)]
    parts.append(stretch.process(np.zeros(0, np.float32), last=True))
    assert np.allclose(np.concatenate(parts), whole, atol=1e-6)


def test_no_audio_stretches_to_none() -> None:
    assert len(TimeStretch(1.5, RATE).process(np.zeros(0, np.float32), last=True)) == 0
