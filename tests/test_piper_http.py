"""Piper's HTTP API (POST /synthesize) over real HTTP: Piper's JSON fields, the streamed 44-byte-header WAV,
length_scale as speed, Piper's fallbacks, bad input. Pipecat's PiperHttpTTSService is in test_agent_frameworks.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest

from rtvoice.engine.voices import embedded_voice_path
from tests.audio import parse_wav, same_speech
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

TEXT = "Piper's clients get a streamed WAV from rtvoice."
RATE = EMBEDDED_VOICE_RATE


def voice_length_scale() -> float:
    """The embedded voice's own length scale, from its config (what Piper's server uses when none is sent)."""
    config = json.loads(embedded_voice_path().with_suffix(".onnx.json").read_text())
    return float(config["inference"]["length_scale"])


def synthesize_http(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/synthesize", json={"text": TEXT, **body}, timeout=60)


def test_a_streamed_wav_with_a_canonical_header_matching_the_engine(server: Server) -> None:
    with httpx.stream("POST", f"{server.url}/synthesize", json={"text": TEXT, "seed": 12}, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
        assert response.headers.get("transfer-encoding") == "chunked" and response.headers["x-sample-rate"] == str(RATE)
        pieces = list(response.iter_raw())
    body = b"".join(pieces)
    header, samples = parse_wav(body)
    assert len(pieces) >= 2  # the header leaves before the audio is complete
    assert header == {
        "riff_size": 0xFFFFFFFF,
        "fmt_size": 16,
        "format": 1,
        "channels": 1,
        "sample_rate": RATE,
        "byte_rate": 2 * RATE,
        "block_align": 2,
        "bits": 16,
        "data_size": 0xFFFFFFFF,
    }
    assert same_speech(samples, synthesize(TEXT, seed=12))


def test_length_scale_is_speed_relative_to_the_voice(server: Server) -> None:
    response = synthesize_http(server, length_scale=2 * voice_length_scale(), seed=3)
    assert response.status_code == 200
    assert same_speech(parse_wav(response.content)[1], synthesize(TEXT, seed=3, speed=0.5))


def test_pipers_other_fields_are_accepted(server: Server) -> None:
    """Speaker and noise fields as Piper's clients send them; an unknown voice speaks with the default voice,
    as in Piper's server, and X-Voice says which."""
    response = synthesize_http(
        server, voice="en_US-ryan-high", speaker="0", speaker_id=0, noise_scale=0.5, noise_w_scale=0.6, seed=7
    )
    assert response.status_code == 200 and response.headers["x-voice"] == "en_US-joe-medium"
    assert same_speech(parse_wav(response.content)[1], synthesize(TEXT, seed=7))
    named = synthesize_http(server, voice="alloy", seed=7)
    assert same_speech(parse_wav(named.content)[1], synthesize(TEXT, seed=7))


def test_piper_json_without_a_content_type(server: Server) -> None:
    """Piper's server reads the body as JSON whatever the Content-Type says; so does rtvoice."""
    response = httpx.post(
        f"{server.url}/synthesize",
        content=json.dumps({"text": TEXT}).encode(),
        headers={"Content-Type": "text/plain"},
        timeout=60,
    )
    header, samples = parse_wav(response.content)
    assert response.status_code == 200 and header["sample_rate"] == RATE and len(samples) / RATE > 1.0
    assert np.sqrt(np.mean((samples / 32767.0) ** 2)) > 0.02


@pytest.mark.parametrize(
    "body,code,param",
    [
        ({}, "empty_input", "text"),
        ({"text": "   "}, "empty_input", "text"),
        ({"text": TEXT, "length_scale": 0}, "invalid_value", "length_scale"),
        ({"text": TEXT, "length_scale": 100}, "invalid_value", "length_scale"),
        ({"text": TEXT, "noise_scale": -1}, "invalid_value", "noise_scale"),
        ({"text": "x" * 4097}, "input_too_long", "text"),
    ],
)
def test_bad_requests(server: Server, body: dict[str, Any], code: str, param: str) -> None:
    response = httpx.post(f"{server.url}/synthesize", json=body, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code and response.json()["error"]["param"] == param


def test_malformed_json(server: Server) -> None:
    for content in (b"{", b"[1, 2]"):
        response = httpx.post(f"{server.url}/synthesize", content=content, timeout=10)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
