"""Audio plumbing: resampling a sine, cross-fades, the streaming WAV header, each encoder round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from rtvoice.engine.audio.encoding import FORMATS, create_encoder, wav_header
from rtvoice.engine.audio.pcm import hamming_crossfade, to_int16
from rtvoice.engine.audio.resample import SUPPORTED_SAMPLE_RATES, StreamResampler
from tests.audio import decode, dominant_frequency, parse_wav, snr_db


def sine(freq: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("out_rate", SUPPORTED_SAMPLE_RATES)
def test_streaming_resampler_keeps_a_sine(out_rate: int) -> None:
    rate, freq = 22050, 440.0
    signal = sine(freq, rate, 1.0)
    resampler = StreamResampler(rate, out_rate)
    pieces = [resampler.process(signal[i : i + 1000]) for i in range(0, len(signal), 1000)]
    pieces.append(resampler.process(np.zeros(0, np.float32), last=True))
    out = np.concatenate(pieces)
    assert abs(len(out) - out_rate) <= 2  # one second in, one second out
    assert abs(dominant_frequency(out[1000:-1000], out_rate) - freq) < 2
    expected = sine(freq, out_rate, 1.0)[: len(out)]
    # Past the filter's edges the resampled sine is the ideal sine at the new rate.
    assert snr_db(expected[500:-500], out[500:-500]) > 40


def test_crossfade_of_equal_signals_is_exact() -> None:
    a = sine(300, 22050, 0.02)
    assert np.allclose(hamming_crossfade(a, a), a, atol=1e-6)
    ramp = hamming_crossfade(np.ones(64, np.float32), np.zeros(64, np.float32))
    assert ramp[0] > 0.9 and ramp[-1] < 0.1 and np.all(np.diff(ramp) <= 1e-6)


def test_wav_header_fields() -> None:
    header, samples = parse_wav(wav_header(24000) + to_int16(np.zeros(10, np.float32)).tobytes())
    assert header["riff_size"] == header["data_size"] == 0xFFFFFFFF
    assert (header["format"], header["channels"], header["sample_rate"], header["bits"]) == (1, 1, 24000, 16)
    assert header["byte_rate"] == 48000 and len(samples) == 10
    header, _ = parse_wav(wav_header(16000, data_bytes=200))
    assert header["data_size"] == 200 and header["riff_size"] == 236


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_encoder_round_trips(name: str) -> None:
    rate = 24000
    pcm = to_int16(sine(440, rate, 1.5))
    encoder = create_encoder(name, rate)
    data = b"".join(encoder.encode(pcm[i : i + 2400]) for i in range(0, len(pcm), 2400)) + encoder.finish()
    if name == "pcm":
        decoded, out_rate = pcm.astype(np.float32) / 32767, rate
    else:
        decoded, out_rate = decode(data)
    seconds = len(decoded) / out_rate
    assert abs(seconds - 1.5) < 0.1, f"{name}: {seconds:.3f} s"
    assert abs(dominant_frequency(decoded, out_rate) - 440) < 3
