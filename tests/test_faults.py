"""Faults fail one stream, not the server: a real server and voice whose model call raises (the
RTVOICE_FAULT_INJECTION test hook replaces only that call) for streams whose text carries a marker.

Each transport shows the failure to its own client (a cut-off HTTP body, an SSE ``error`` event, a WebSocket ``synthesis_failed``, a WHEP ``error`` event) while a stream running at the
same time is served whole. Bad voice files stop the server at start-up with a message naming them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import websockets

from bench.servers import REPO
from rtvoice.engine.faults import parse_faults
from tests.audio import parse_wav
from tests.conftest import Server
from tests.whep_client import refused_then_spoken

CLEAN = "A clean stream runs beside the failing one and is spoken to its very end."
LATE_FAILURE = "This first sentence is spoken. The second one carries FAILDECODE and breaks."
EARLY_FAILURE = "FAILENCODE breaks before any audio."


@pytest.fixture(scope="module")
def faulty(start_server: Callable[..., Server]) -> Server:
    # One stream per model call, so a failing call holds the failing stream only.
    return start_server(fault_injection="decode:FAILDECODE,encode:FAILENCODE", max_batch_size="1")


def speech(server: Server, text: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav", **extra})


def test_the_hook_parses_and_is_off_by_default() -> None:
    assert [(f.kind, f.marker) for f in parse_faults("decode:X, lm:Y")] == [("decode", "X"), ("lm", "Y")]
    assert parse_faults("") == []
    with pytest.raises(ValueError):
        parse_faults("decode")
    from rtvoice.engine.settings import Settings

    assert Settings(_env_file=None).fault_injection == ""


def test_http_body_that_fails_midway_is_cut_off_and_the_neighbour_is_whole(faulty: Server) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            async def failing() -> tuple[int, bytes, BaseException | None]:
                got = b""
                async with client.stream("POST", f"{faulty.url}/inference_sft",
                                         data={"tts_text": LATE_FAILURE}) as response:
                    try:
                        async for chunk in response.aiter_bytes():
                            got += chunk
                    except httpx.HTTPError as error:
                        return response.status_code, got, error
                return response.status_code, got, None

            async def clean() -> bytes:
                response = await client.post(f"{faulty.url}/inference_sft", data={"tts_text": CLEAN})
                assert response.status_code == 200
                return response.content

            (status, partial, error), whole = await asyncio.gather(failing(), clean())
        assert status == 200 and isinstance(error, httpx.RemoteProtocolError), error  # an unterminated body
        assert len(partial) > 44  # the first sentence's audio had left
        _, samples = parse_wav(whole)
        reference = speech(faulty, CLEAN)  # the same text alone
        assert len(samples) / 22050 > 3 and reference.status_code == 200

    asyncio.run(main())
    assert httpx.get(f"{faulty.url}/readyz").status_code == 200


def test_failure_before_any_audio_cuts_the_body_too(faulty: Server) -> None:
    """The status left at once (the client knows it was admitted): a failure before any audio cuts the body."""
    with httpx.stream("POST", f"{faulty.url}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "voice": "alloy", "input": EARLY_FAILURE, "response_format": "wav"}) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            response.read()
    assert speech(faulty, "Still fine afterwards.").status_code == 200


def test_sse_gets_an_error_event_then_the_cut(faulty: Server) -> None:
    text = ""
    with httpx.stream("POST", f"{faulty.url}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "voice": "alloy", "input": LATE_FAILURE, "stream_format": "sse"}) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in response.iter_text():
                text += chunk
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    audio = [event for event in events if event["type"] != "speech.word"]  # words go before their audio
    assert audio[0]["type"] == "speech.audio.delta" and audio[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "synthesis_failed"
    assert not any(event["type"] == "speech.audio.done" for event in events)


def test_websocket_utterance_fails_alone(faulty: Server) -> None:
    async def main() -> None:
        url = faulty.url.replace("http", "ws") + "/v1/tts/stream"
        async with websockets.connect(url) as failing, websockets.connect(url) as other:
            for ws in (failing, other):
                await ws.send(json.dumps({"type": "start"}))
                assert json.loads(await ws.recv())["type"] == "started"
            await other.send(json.dumps({"type": "text", "text": CLEAN}))
            await other.send(json.dumps({"type": "end"}))
            await failing.send(json.dumps({"type": "text", "text": LATE_FAILURE}))
            await failing.send(json.dumps({"type": "flush"}))
            await failing.send(json.dumps({"type": "text", "text": "The next utterance works."}))
            await failing.send(json.dumps({"type": "end"}))
            failing_events = [json.loads(m) async for m in failing if isinstance(m, str)]
            other_events = [json.loads(m) async for m in other if isinstance(m, str)]
        errors = [e for e in failing_events if e["type"] == "error"]
        assert [(e["code"], e["utterance"]) for e in errors] == [("synthesis_failed", 0)]
        dones = [e for e in failing_events if e["type"] == "done"]
        assert [d["utterance"] for d in dones] == [1] and dones[0]["final"] and dones[0]["audio_s"] > 0.5
        assert other_events[-1]["type"] == "done" and other_events[-1]["audio_s"] > 3
        assert not any(e["type"] == "error" for e in other_events)

    asyncio.run(main())


def test_whep_utterance_fails_with_an_error_event(faulty: Server) -> None:
    asyncio.run(refused_then_spoken(faulty.url, LATE_FAILURE, "synthesis_failed"))


# -- start-up -----------------------------------------------------------------------------------------------


def serve(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    from bench.servers import free_port

    return subprocess.run([sys.executable, "-m", "rtvoice.app.cli", "serve"], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**__import__("os").environ, "RTVOICE_PORT": str(free_port()), **env})


def test_a_corrupt_voice_file_stops_the_server_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx graph")
    (tmp_path / "broken.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}}))
    result = serve({"RTVOICE_VOICES_DIR": str(tmp_path)})
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cannot load the Piper voice {tmp_path / 'broken.onnx'}" in result.stderr
    assert "stopping: the engine could not start" in result.stderr


def test_invalid_settings_stop_the_server_at_once() -> None:
    for env in ({"RTVOICE_API_KEYS": "a:same,b:same"}, {"RTVOICE_FAULT_INJECTION": "nocolon"}):
        result = serve(env, timeout=60)
        assert result.returncode == 2 and "invalid setting" in result.stderr, (env, result.stderr[-1000:])
