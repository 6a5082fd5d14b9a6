"""Graceful drain on SIGTERM, with a real server process and streams in flight.

/readyz turns 503 at once and new requests get 503 with Retry-After; streams in progress finish; then
WebSockets get ``server_shutting_down`` and close 1001, WHEP sessions end, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

from testkit.polling import wait_for
from testkit.servers import Server, start_rtvoice
from testkit.whep_client import WhepPlayer
from tests.audio import parse_wav
from tests.engine_output import EMBEDDED_VOICE_RATE

LONG_TEXT = " ".join(["The drain lets this sentence finish before the server goes away."] * 6)


def ws_url(server: Server) -> str:
    return server.url.replace("http", "ws") + "/v1/tts/stream"


async def started(server: Server) -> Any:
    ws = await websockets.connect(ws_url(server))
    await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
    assert json.loads(await ws.recv())["type"] == "started"
    return ws


async def until_closed(ws: Any) -> tuple[list[dict[str, Any]], int, int | None, str]:
    """Every event and the audio bytes until the server closes; with the close code and reason."""
    events, audio = [], 0
    try:
        async for message in ws:
            if isinstance(message, bytes):
                audio += len(message)
            else:
                events.append(json.loads(message))
    except websockets.ConnectionClosed:
        pass
    close = ws.protocol.close_rcvd
    return events, audio, close.code if close else None, close.reason if close else ""


def refused_while_draining(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/audio/speech", json={"model": "tts-1", "input": "Too late.", "voice": "alloy"}
    )
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "server_shutting_down"
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_sigterm_lets_streams_finish_then_closes_sockets_and_exits_0(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    server = start_rtvoice(
        {"RTVOICE_DRAIN_TIMEOUT_S": "60", "RTVOICE_LOG_LEVEL": "info", "RTVOICE_WARMUP": "false"}, log_file=log_file
    )

    async def main() -> None:
        speaking, idle = await started(server), await started(server)
        await speaking.send(json.dumps({"type": "text", "text": LONG_TEXT}))
        await speaking.send(json.dumps({"type": "flush"}))
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", f"{server.url}/inference_sft", data={"tts_text": LONG_TEXT}) as body:
                reader = body.aiter_bytes()
                chunks = [await anext(reader)]
                first = json.loads(await speaking.recv())
                assert first["type"] == "audio_start"
                sigterm_at = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                ready = await client.get(f"{server.url}/readyz")
                assert ready.status_code == 503 and ready.json()["status"] == "draining"
                await asyncio.to_thread(refused_while_draining, server)
                try:
                    await websockets.connect(ws_url(server))
                    raise AssertionError("a new WebSocket was accepted while draining")
                except websockets.InvalidStatus as refused:
                    assert refused.response.status_code == 503
                async for chunk in reader:  # the body in flight is served to its end
                    chunks.append(chunk)
        wav = b"".join(chunks)
        _, samples = parse_wav(wav)
        assert len(samples) / EMBEDDED_VOICE_RATE > 10, "the whole text was spoken"
        speaking_events, speaking_audio, code, reason = await until_closed(speaking)
        idle_events, _, idle_code, _ = await until_closed(idle)
        kinds = [event["type"] for event in speaking_events]
        # The utterance in progress finished (its done, all its audio), and only then came the goodbye.
        assert "done" in kinds and kinds.index("done") < kinds.index("error"), kinds
        done = speaking_events[kinds.index("done")]
        assert abs(done["audio_s"] - speaking_audio / 2 / 16000) < 0.01 and done["audio_s"] > 10
        assert speaking_events[-1]["code"] == "server_shutting_down" and (code, reason) == (
            1001,
            "server shutting down",
        )
        assert idle_events[-1]["code"] == "server_shutting_down" and idle_code == 1001
        assert await asyncio.to_thread(server.process.wait, 30) == 0
        assert time.monotonic() - sigterm_at < 60  # it did not wait for the timeout: everything had finished

    asyncio.run(main())
    log = log_file.read_text()
    assert "draining: new requests get 503" in log and "drained in" in log, log[-3000:]


def test_the_drain_timeout_closes_what_is_still_open(tmp_path: Path) -> None:
    """A WebSocket utterance that never ends and a WHEP session: closed when the timeout runs out, then exit 0."""
    server = start_rtvoice({"RTVOICE_DRAIN_TIMEOUT_S": "2", "RTVOICE_WARMUP": "false"})

    async def main() -> None:
        ws = await started(server)
        await ws.send(json.dumps({"type": "text", "text": "An utterance that never gets its end"}))
        player = await WhepPlayer(server.url).start()
        try:
            sigterm_at = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            events, _, code, _ = await until_closed(ws)
            closed_after = time.monotonic() - sigterm_at
            assert events[-1]["code"] == "server_shutting_down" and code == 1001
            assert 1.9 < closed_after < 20, closed_after
            goodbye = await player.event("error", timeout=20)
            assert goodbye["code"] == "server_shutting_down"
            assert await asyncio.to_thread(wait_for, lambda: player.pc.connectionState in ("closed", "failed"), 40)
        finally:
            await player.close(delete=False)
        assert await asyncio.to_thread(server.process.wait, 30) == 0

    asyncio.run(main())
