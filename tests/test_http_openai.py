"""OpenAI's speech API over real HTTP: every response format, SSE events, bad input, voices, docs."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from tests.audio import decode, parse_wav, same_speech
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

TEXT = "Streaming speech for voice agents, one sentence at a time."


def speech(server: Server, **body: object) -> httpx.Response:
    payload = {"model": "tts-1", "input": TEXT, "voice": "alloy", **body}
    return httpx.post(f"{server.url}/v1/audio/speech", json=payload, timeout=60)


def test_pcm_is_24khz_s16le_and_matches_the_engine(server: Server) -> None:
    response = speech(server, response_format="pcm", seed=21)
    assert response.status_code == 200 and response.headers["x-sample-rate"] == "24000"
    samples = np.frombuffer(response.content, dtype="<i2")
    assert same_speech(samples, synthesize(TEXT, seed=21, sample_rate=24000))


@pytest.mark.parametrize(
    "fmt,content_type",
    [
        ("mp3", "audio/mpeg"),
        ("opus", "audio/ogg; codecs=opus"),
        ("aac", "audio/aac"),
        ("flac", "audio/flac"),
        ("wav", "audio/wav"),
    ],
)
def test_each_format_decodes_to_the_right_length(server: Server, fmt: str, content_type: str) -> None:
    expected_s = len(np.frombuffer(speech(server, response_format="pcm", seed=4).content, dtype="<i2")) / 24000
    response = speech(server, response_format=fmt, seed=4)
    assert response.status_code == 200 and response.headers["content-type"] == content_type
    audio, rate = decode(response.content)
    # Lossy codecs add priming and padding of a frame or two.
    assert abs(len(audio) / rate - expected_s) < 0.08, (fmt, len(audio) / rate, expected_s)
    assert np.sqrt(np.mean(audio**2)) > 0.01
    if fmt == "wav":
        header, samples = parse_wav(response.content)
        assert header["sample_rate"] == 24000 and len(samples) / 24000 == expected_s


def test_default_format_is_mp3(server: Server) -> None:
    response = speech(server)
    assert response.headers["content-type"] == "audio/mpeg"
    assert decode(response.content)[1] == 24000


def test_sse_event_shapes(server: Server) -> None:
    response = speech(server, response_format="pcm", stream_format="sse", seed=8)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b.strip()]
    events = []
    for block in blocks:
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block
        events.append(json.loads("".join(line[len("data: ") :] for line in lines)))
    words = [e for e in events if e["type"] == "speech.word"]
    deltas, done = [e for e in events[:-1] if e["type"] != "speech.word"], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" and set(e) == {"type", "audio"} for e in deltas)
    assert [w["text"] for w in words] == [w for w in TEXT.replace(",", "").replace(".", "").split()]
    assert all(TEXT[w["char_start"] : w["char_end"]] == w["text"] and not w["approximate"] for w in words)
    assert done["type"] == "speech.audio.done" and 0 < done["ttfa_ms"] < 60_000  # rtvoice's extension field
    usage = done["usage"]
    assert set(usage) == {"input_tokens", "output_tokens", "total_tokens"}
    assert all(isinstance(v, int) and v > 0 for v in usage.values())
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert same_speech(np.frombuffer(audio, dtype="<i2"), synthesize(TEXT, seed=8, sample_rate=24000))


def test_extra_fields_and_instructions_are_accepted(server: Server) -> None:
    response = speech(
        server, response_format="pcm", instructions="Speak warmly.", temperature=0.3, something_new={"a": 1}
    )
    assert response.status_code == 200 and len(response.content) > 24000


def test_voice_ids_and_openai_names(server: Server) -> None:
    by_id = speech(server, voice="en_US-joe-medium", response_format="pcm", seed=1)
    by_name = speech(server, voice="nova", response_format="pcm", seed=1)
    by_object = speech(server, voice={"id": "echo"}, response_format="pcm", seed=1)
    assert by_id.status_code == by_name.status_code == by_object.status_code == 200
    pcm = [np.frombuffer(r.content, "<i2") for r in (by_id, by_name, by_object)]
    assert same_speech(pcm[1], pcm[0]) and same_speech(pcm[2], pcm[0])


def test_speed(server: Server) -> None:
    normal = len(speech(server, response_format="pcm", seed=2).content)
    fast = len(speech(server, response_format="pcm", seed=2, speed=2.0).content)
    assert 0.4 < fast / normal < 0.6  # half, to a frame a sentence (engine/models/piper/pace.py)


BAD_BODIES = [
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"voice": "bob"}, "voice"),
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 0.1}, "speed"),
    ({"speed": 4.5}, "speed"),
    ({"stream_format": "chunks"}, "stream_format"),
    ({"input": 42}, "input"),
]


@pytest.mark.parametrize("change,param", BAD_BODIES)
def test_bad_input(server: Server, change: dict[str, object], param: str) -> None:
    response = speech(server, **change)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
    if param == "voice":
        assert "en_US-joe-medium" in error["message"] and "alloy" in error["message"]


@pytest.mark.parametrize("missing", ["model", "input", "voice"])
def test_required_fields(server: Server, missing: str) -> None:
    payload = {"model": "tts-1", "input": TEXT, "voice": "alloy"}
    del payload[missing]
    response = httpx.post(f"{server.url}/v1/audio/speech", json=payload, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == missing


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"", "\u00ff".encode("latin-1")])
def test_malformed_json(server: Server, content: bytes) -> None:
    response = httpx.post(
        f"{server.url}/v1/audio/speech", content=content, headers={"content-type": "application/json"}, timeout=10
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_voice_lists(server: Server) -> None:
    voices = httpx.get(f"{server.url}/voices").json()
    joe = next(v for v in voices if v["id"] == "en_US-joe-medium")
    assert joe["sample_rate"] == EMBEDDED_VOICE_RATE and joe["language"] == "en_US" and joe["model"] == "piper"
    listing = httpx.get(f"{server.url}/v1/audio/voices").json()
    assert [v["id"] for v in listing["voices"]] == [v["id"] for v in voices]
    assert listing["aliases"]["alloy"] == "en_US-joe-medium"
    assert httpx.get(f"{server.url}/readyz").json()["voices"] == [v["id"] for v in voices]


def test_health_docs_and_unknown_routes(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/readyz").json()["status"] == "ready"
    assert httpx.get(f"{server.url}/docs").status_code == 200
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert {"/v1/audio/speech", "/inference_sft", "/voices", "/metrics"} <= set(paths)
    missing = httpx.get(f"{server.url}/no/such/route")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong_method = httpx.get(f"{server.url}/v1/audio/speech")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_official_openai_client(server: Server) -> None:
    """OpenAI's own Python SDK, pointed at rtvoice, streams speech and sees our errors as its errors."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
    ) as response:
        pcm = b"".join(response.iter_bytes())
    assert len(pcm) / 2 / 24000 > 1.0
    mp3 = client.audio.speech.create(
        model="gpt-4o-mini-tts", voice="coral", input="Hi there.", instructions="Cheerful."
    )
    assert decode(mp3.content)[1] == 24000
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")
    assert "valid voices" in str(error.value)


def test_official_openai_client_passes_over_the_word_events(server: Server) -> None:
    """``stream_format="sse"`` through OpenAI's SDK, its events read with the SDK's own SSE decoder: the audio
    is in the ``speech.audio.delta`` events as always, and the ``speech.word`` extension events are extra events a
    client that acts on OpenAI's types passes over."""
    openai = pytest.importorskip("openai")
    from openai._streaming import SSEDecoder

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        stream_format="sse",
        extra_body={"seed": 8},
    ) as response:
        events = [event.json() for event in SSEDecoder().iter_bytes(response.iter_bytes())]
    kinds = [event["type"] for event in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds) == {"speech.audio.delta", "speech.word", "speech.audio.done"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert same_speech(np.frombuffer(audio, dtype="<i2"), synthesize(TEXT, seed=8, sample_rate=24000))
    words = [e for e in events if e["type"] == "speech.word"]
    assert words[0]["text"] == "Streaming" and words[0]["start_s"] < words[-1]["start_s"] < len(audio) / 2 / 24000


@pytest.mark.parametrize(
    "written,spoken",
    [
        ("Bring snacks, e.g. apples.", "Bring snacks, for example apples."),
        (
            "Dr. Smith paid $1,250.75.",
            "Doctor Smith paid one thousand two hundred fifty dollars and seventy five cents.",
        ),
        ("Born 07/04/1990 at 18:20.", "Born July fourth, nineteen ninety at eighteen twenty."),
    ],
)
def test_normalize_reads_the_spoken_form_and_false_reads_the_text_as_sent(
    server: Server, written: str, spoken: str
) -> None:
    """The voice hears the spoken form: the same speech, sample for sample, as the spoken form sent as text."""
    normalized = np.frombuffer(speech(server, input=written, response_format="pcm", seed=5).content, dtype="<i2")
    said = np.frombuffer(speech(server, input=spoken, response_format="pcm", seed=5).content, dtype="<i2")
    as_sent = speech(server, input=written, response_format="pcm", seed=5, normalize=False)
    assert as_sent.status_code == 200
    assert same_speech(normalized, said)
    assert not same_speech(np.frombuffer(as_sent.content, dtype="<i2"), said)
