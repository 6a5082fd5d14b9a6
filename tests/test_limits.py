"""A limit on every input, each with a clear 4xx or close code; slow clients hold nothing for long.

Real server, real sockets: raw TCP for slow and oversized request heads and bodies, websockets for frames and
idle sockets, aiortc for DataChannel messages.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest
import websockets

from testkit.polling import wait_for, wait_for_async
from testkit.whep_client import refused_then_spoken
from tests.conftest import Server
from tests.test_whep import offer_sdp

LIMITS = {
    "max_body_bytes": "4096",
    "max_upload_bytes": "65536",
    "max_form_parts": "4",
    "body_timeout_s": "1.5",
    "header_timeout_s": "1.5",
    "max_header_bytes": "4096",
    "ws_max_message_bytes": "2048",
    "ws_max_connections": "3",
    "ws_idle_timeout_s": "1.5",
    "whep_max_sdp_bytes": "16384",
    "whep_max_trickle_bytes": "1024",
    "whep_max_message_bytes": "1024",
    "max_connections": "40",
}


@pytest.fixture(scope="module")
def limited(start_server: Callable[..., Server]) -> Server:
    return start_server(**LIMITS, warmup="false")


def address(server: Server) -> tuple[str, int]:
    url = httpx.URL(server.url)
    return url.host, int(url.port or 80)


def error_code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    return str(response.json()["error"]["code"])


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


# -- bodies ---------------------------------------------------------------------------------------------


def test_body_size_by_content_length_and_by_chunks(limited: Server) -> None:
    url = f"{limited.url}/v1/audio/speech"
    big = json.dumps({"model": "tts-1", "voice": "alloy", "input": "a" * 5000})
    assert (
        error_code(httpx.post(url, content=big, headers={"Content-Type": "application/json"}), 413) == "body_too_large"
    )

    def chunks():  # no Content-Length: chunked transfer, refused once the limit is passed
        for _ in range(10):
            yield b"x" * 1000

    assert error_code(httpx.post(url, content=chunks()), 413) == "body_too_large"
    assert (
        error_code(httpx.post(f"{limited.url}/inference_sft", data={"tts_text": "a" * 5000}), 413) == "body_too_large"
    )
    fine = httpx.post(
        url, json={"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "pcm"}, timeout=60
    )
    assert fine.status_code == 200 and len(fine.content) > 10_000


def test_upload_size_and_form_parts(limited: Server) -> None:
    files = {"prompt_wav": ("p.wav", b"\0" * 70_000, "audio/wav")}
    response = httpx.post(f"{limited.url}/inference_cross_lingual", data={"tts_text": "Hi."}, files=files)
    assert error_code(response, 413) == "body_too_large"
    fields = {f"field{i}": "x" for i in range(6)}
    response = httpx.post(
        f"{limited.url}/inference_sft", data={"tts_text": "Hi.", **fields}, files={"f": ("f.txt", b"x", "text/plain")}
    )
    assert response.status_code == 400 and "malformed form body" in response.json()["error"]["message"]


def test_a_slow_body_gets_408_and_frees_the_connection(limited: Server) -> None:
    host, port = address(limited)
    with socket.create_connection((host, port)) as sock:
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model"'
        )
        started = time.monotonic()
        answer = read_all(sock, timeout=10)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"body_timeout"' in answer and 1.0 < took < 5, took


def test_slow_headers_and_silent_connections_are_closed(limited: Server) -> None:
    """Slowloris: a head sent a byte at a time, and a connection that sends nothing, are cut off at the deadline,
    while other clients are served meanwhile."""
    host, port = address(limited)
    slow = [socket.create_connection((host, port)) for _ in range(10)]
    silent = socket.create_connection((host, port))
    started = time.monotonic()
    try:
        for sock in slow:
            sock.sendall(b"GET /voices HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # keep trickling, well inside the deadline each time
            for sock in slow:
                sock.sendall(b"X-Slow: 1\r\n")
            assert httpx.get(f"{limited.url}/voices").status_code == 200
            time.sleep(0.2)
        answers = [read_all(sock, timeout=10) for sock in slow]
        assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), answers[0][:100]
        assert read_all(silent, timeout=10).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 6
    finally:
        for sock in [*slow, silent]:
            sock.close()
    assert httpx.get(f"{limited.url}/voices").status_code == 200


def test_connections_at_once(start_server: Callable[..., Server]) -> None:
    """uvicorn's limit_concurrency (RTVOICE_MAX_CONNECTIONS): past it, 503 at once; the head deadline then frees
    the idle connections and requests pass again."""
    server = start_server(max_connections="6", header_timeout_s="1.5", warmup="false")
    host, port = address(server)
    idle = [socket.create_connection((host, port)) for _ in range(6)]
    try:
        assert wait_for(lambda: httpx.get(f"{server.url}/healthz").status_code == 503, timeout=5)
        assert wait_for(lambda: httpx.get(f"{server.url}/voices").status_code == 200, timeout=15)
    finally:
        for sock in idle:
            sock.close()


def test_an_oversized_head_gets_431(limited: Server) -> None:
    host, port = address(limited)
    with socket.create_connection((host, port)) as sock:
        sock.sendall(b"GET /voices HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(10):
                sock.sendall(b"X-Big: " + b"y" * 1000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_all(sock, timeout=10).startswith(b"HTTP/1.1 431")


# -- WebSockets --------------------------------------------------------------------------------------------


def ws_url(server: Server) -> str:
    return server.url.replace("http", "ws") + "/v1/tts/stream"


def test_a_websocket_message_over_the_limit_closes_1009(limited: Server) -> None:
    async def main() -> None:
        async with websockets.connect(ws_url(limited), max_size=None) as ws:
            await ws.send(json.dumps({"type": "text", "text": "a" * 4000}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    asyncio.run(main())


def test_a_websocket_waiting_for_a_slow_first_audio_is_not_idle(start_server: Callable[..., Server]) -> None:
    """The client has sent its text and ``end``; on a machine slow enough (calls held 40 times their time) the first
    audio comes later than the idle timeout, and the socket stays open for it (CI once closed it, under load). An idle
    socket beside it is still closed."""
    idle_timeout_s = 0.5
    slow = start_server(ws_idle_timeout_s=str(idle_timeout_s), model_cost_scale="40", warmup="false")

    async def main() -> None:
        async with websockets.connect(ws_url(slow)) as idle, websockets.connect(ws_url(slow)) as waiting:
            # Sent back to back: a loaded machine's round trip between them must not count as the client idling.
            await waiting.send(json.dumps({"type": "start", "sample_rate": 16000}))
            await waiting.send(json.dumps({"type": "text", "text": "Hello there."}))
            await waiting.send(json.dumps({"type": "end"}))
            ended_at = time.monotonic()
            first_audio_at = final = None
            async for message in waiting:
                if isinstance(message, bytes) and first_audio_at is None:
                    first_audio_at = time.monotonic()
                elif isinstance(message, str) and json.loads(message)["type"] == "done":
                    final = json.loads(message)
            assert first_audio_at is not None, "closed before its first audio"
            assert first_audio_at - ended_at > idle_timeout_s, "no wait longer than the timeout"
            assert final is not None and final["final"] and final["audio_s"] > 0.5
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(idle.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.reason == "idle timeout"

    asyncio.run(main())


def test_an_idle_websocket_is_closed_but_a_speaking_one_is_not(limited: Server) -> None:
    async def main() -> None:
        async with websockets.connect(ws_url(limited)) as idle, websockets.connect(ws_url(limited)) as busy:
            await busy.send(json.dumps({"type": "start", "sample_rate": 16000}))
            assert json.loads(await busy.recv())["type"] == "started"
            # About 8 s of speech at real-time pace keeps the socket busy past the 1.5 s idle timeout.
            await busy.send(json.dumps({"type": "text", "text": "Keep talking for a while please. " * 4}))
            await busy.send(json.dumps({"type": "end"}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(idle.recv(), 10)
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "idle timeout")
            final = None
            async for message in busy:
                if isinstance(message, str) and json.loads(message)["type"] == "done":
                    final = json.loads(message)
            assert final is not None and final["final"] and final["audio_s"] > 3

    asyncio.run(main())


def test_websocket_connections_at_once(limited: Server) -> None:
    async def main() -> None:
        sockets = [await websockets.connect(ws_url(limited)) for _ in range(3)]
        try:
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(ws_url(limited))
            response = refused.value.response
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
            assert json.loads(response.body)["error"]["code"] == "too_many_connections"
        finally:
            for ws in sockets:
                await ws.close()
        # The slots come back as the server sees the closes: until then a connect may still be refused.
        connected: list[websockets.ClientConnection] = []

        async def slot_back() -> bool:
            try:
                connected.append(await websockets.connect(ws_url(limited)))
            except websockets.InvalidStatus as still_full:
                assert still_full.response.status_code == 503
                return False
            return True

        assert await wait_for_async(slot_back, 10), "no slot came back"
        async with connected[0] as ws:
            await ws.send(json.dumps({"type": "start"}))
            assert json.loads(await ws.recv())["type"] == "started"

    asyncio.run(main())


# -- WHEP -------------------------------------------------------------------------------------------------


def test_sdp_and_trickle_sizes(limited: Server) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        try:
            padded = sdp + "a=x-padding:" + "p" * 20_000 + "\r\n"
            response = httpx.post(f"{limited.url}/whep", content=padded, headers={"Content-Type": "application/sdp"})
            assert error_code(response, 413) == "body_too_large"
            created = httpx.post(f"{limited.url}/whep", content=sdp, headers={"Content-Type": "application/sdp"})
            assert created.status_code == 201
            session = f"{limited.url}{created.headers['location']}"
            fragment = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n" * 30
            response = httpx.patch(
                session, content=fragment, headers={"Content-Type": "application/trickle-ice-sdpfrag"}
            )
            assert error_code(response, 413) == "body_too_large"
            assert httpx.delete(session).status_code == 200
        finally:
            await pc.close()

    asyncio.run(main())


def test_datachannel_message_size(limited: Server) -> None:
    big = json.dumps({"type": "tts_request", "text": "x" * 2000})
    assert len(big) > int(LIMITS["whep_max_message_bytes"])
    asyncio.run(refused_then_spoken(limited.url, "x" * 2000, "message_too_large"))
