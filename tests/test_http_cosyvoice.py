"""CosyVoice's form API over real HTTP: streaming WAV and PCM, bad input, disconnects."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from testkit.polling import wait_for
from tests.audio import parse_wav, rms, same_speech
from tests.conftest import Server, settled_audio_seconds
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

TEXT = "Hello there. This sentence comes from rtvoice, streaming as it speaks."
LONG_TEXT = " ".join(
    [
        "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone expected a",
        "short meeting, but the discussion about the new budget, the delayed construction of the bridge, and the",
        "future of the community garden went on for hours.",
    ]
    * 4
)


def test_streaming_wav_matches_the_engine(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/inference_sft", data={"tts_text": TEXT, "spk_id": "en_US-joe-medium", "seed": "11"}, timeout=60
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["x-sample-rate"] == str(EMBEDDED_VOICE_RATE)
    assert response.headers.get("transfer-encoding") == "chunked"
    header, samples = parse_wav(response.content)
    assert header["sample_rate"] == EMBEDDED_VOICE_RATE and header["channels"] == 1 and header["bits"] == 16
    assert header["data_size"] == 0xFFFFFFFF  # streaming: length unknown when the header left
    assert (len(response.content) - 44) % 2 == 0
    expected = synthesize(TEXT, seed=11)
    assert len(samples) == len(expected)
    assert same_speech(samples, expected)
    assert 2.0 < len(samples) / EMBEDDED_VOICE_RATE < 8.0 and rms(samples) > 0.01


def test_pcm_format_is_the_raw_samples(server: Server) -> None:
    wav = httpx.post(f"{server.url}/inference_sft", data={"tts_text": TEXT, "seed": "5"}, timeout=60)
    pcm = httpx.post(f"{server.url}/inference_sft", data={"tts_text": TEXT, "seed": "5", "format": "pcm"}, timeout=60)
    assert pcm.status_code == 200 and pcm.headers["content-type"] == "audio/pcm"
    assert same_speech(np.frombuffer(pcm.content, "<i2"), parse_wav(wav.content)[1])


def test_get_with_query_and_with_form_body(server: Server) -> None:
    by_query = httpx.get(f"{server.url}/inference_sft", params={"tts_text": "Good morning.", "seed": "2"}, timeout=60)
    # CosyVoice's own client sends its form in the body of a GET.
    by_form = httpx.request(
        "GET", f"{server.url}/inference_sft", data={"tts_text": "Good morning.", "seed": "2"}, timeout=60
    )
    assert by_query.status_code == by_form.status_code == 200
    assert by_query.content[:44] == by_form.content[:44] and len(by_query.content) > 44 + EMBEDDED_VOICE_RATE
    assert same_speech(parse_wav(by_query.content)[1], parse_wav(by_form.content)[1])


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_resampled_output(server: Server, rate: int) -> None:
    response = httpx.post(
        f"{server.url}/inference_sft", data={"tts_text": TEXT, "seed": "3", "sample_rate": str(rate)}, timeout=60
    )
    header, samples = parse_wav(response.content)
    assert header["sample_rate"] == rate and response.headers["x-sample-rate"] == str(rate)
    native = synthesize(TEXT, seed=3)
    assert abs(len(samples) / rate - len(native) / EMBEDDED_VOICE_RATE) < 0.01
    assert same_speech(samples, synthesize(TEXT, seed=3, sample_rate=rate))


def test_first_audio_arrives_while_synthesis_runs(server: Server) -> None:
    """Audio streams out before the long text is synthesised: the stream is still active at the first bytes."""
    with httpx.stream(
        "POST", f"{server.url}/inference_sft", data={"tts_text": LONG_TEXT, "format": "pcm"}, timeout=60
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        assert len(first) > 0
        assert server.metric("rtvoice_active_streams") >= 1
        rest = b"".join(chunks)
    total_seconds = (len(first) + len(rest)) / 2 / EMBEDDED_VOICE_RATE
    assert total_seconds > 20
    # The first read is a small part of the whole (a client slowed by a loaded machine reads a few chunks at once).
    assert len(first) / 2 / EMBEDDED_VOICE_RATE < total_seconds / 10


def test_disconnect_cancels_synthesis(server: Server) -> None:
    cancelled_before = server.metric("rtvoice_streams_total", {"outcome": "cancelled"})
    audio_before = server.metric("rtvoice_audio_seconds_total")
    with httpx.stream(
        "POST", f"{server.url}/inference_sft", data={"tts_text": LONG_TEXT * 3, "format": "pcm"}, timeout=60
    ) as response:
        chunks = response.iter_bytes()  # keep the iterator: dropping it closes the connection
        next(chunks)
        assert server.metric("rtvoice_active_streams") >= 1
    # The client is gone: the stream is cancelled and its slot freed at once.
    assert wait_for(lambda: server.metric("rtvoice_active_streams") == 0)
    assert server.metric("rtvoice_streams_total", {"outcome": "cancelled"}) == cancelled_before + 1
    # Far less than the ~90 s of speech the text holds was made.
    assert settled_audio_seconds(server) - audio_before < 30


BAD_FORMS = [
    ({}, "tts_text"),
    ({"tts_text": ""}, "tts_text"),
    ({"tts_text": "   \n "}, "tts_text"),
    ({"tts_text": "x" * 4097}, "tts_text"),
    ({"tts_text": "?!..."}, "tts_text"),
    ({"tts_text": "Hi.", "spk_id": "nobody"}, "spk_id"),
    ({"tts_text": "Hi.", "format": "mp3"}, "format"),
    ({"tts_text": "Hi.", "sample_rate": "12345"}, "sample_rate"),
    ({"tts_text": "Hi.", "sample_rate": "fast"}, "sample_rate"),
    ({"tts_text": "Hi.", "speed": "9"}, "speed"),
]


@pytest.mark.parametrize("form,param", BAD_FORMS)
def test_bad_input_gets_a_4xx_naming_the_problem(server: Server, form: dict[str, str], param: str) -> None:
    response = httpx.post(f"{server.url}/inference_sft", data=form, timeout=10)
    assert 400 <= response.status_code < 500
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
    if param == "spk_id":
        assert "en_US-joe-medium" in error["message"]  # the valid ids are listed


def test_malformed_form_body(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/inference_sft",
        content=b"--xyz\r\nbroken",
        headers={"content-type": "multipart/form-data; boundary=xyz"},
        timeout=10,
    )
    assert response.status_code == 400 and response.json()["error"]["message"]


def test_a_bad_request_does_not_disturb_a_good_one(server: Server) -> None:
    with httpx.stream("POST", f"{server.url}/inference_sft", data={"tts_text": TEXT, "seed": "11"}, timeout=60) as good:
        bad = httpx.post(f"{server.url}/inference_sft", data={"tts_text": ""}, timeout=10)
        body = good.read()
    assert bad.status_code == 400
    assert same_speech(parse_wav(body)[1], synthesize(TEXT, seed=11))
