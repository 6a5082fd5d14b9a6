"""API keys, per-key quotas and request ids, against real servers on loopback (httpx, websockets, the OpenAI SDK)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import websockets

from rtvoice.app.access import KeyRing, RequestRate, parse_api_keys, warn_if_open
from rtvoice.app.settings import Settings
from testkit.polling import wait_for
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-9876543210"
SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"}


@pytest.fixture(scope="module")
def keyed(start_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> tuple[Server, Path]:
    log_file = tmp_path_factory.mktemp("keyed") / "server.log"
    from testkit.servers import start_rtvoice

    server = start_rtvoice(
        {
            "RTVOICE_API_KEYS": f"alice:{ALICE},{BOB}",
            "RTVOICE_KEY_MAX_STREAMS": "1",
            "RTVOICE_LOG_LEVEL": "info",
            "RTVOICE_WARMUP": "false",
        },
        log_file=log_file,
    )
    yield server, log_file
    server.stop()


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.headers
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["request_id"] == response.headers["x-request-id"]
    return error


def test_a_key_is_needed_and_accepted_two_ways(keyed: tuple[Server, Path]) -> None:
    server, _ = keyed
    url = f"{server.url}/v1/audio/speech"
    error_of(httpx.post(url, json=SPEECH), 401, "missing_api_key")
    error_of(httpx.post(url, json=SPEECH, headers={"Authorization": "Bearer sk-wrong"}), 401, "invalid_api_key")
    error_of(httpx.post(url, json=SPEECH, headers={"Authorization": f"Bearer {ALICE}x"}), 401, "invalid_api_key")
    error_of(httpx.post(url, json=SPEECH, params={"api_key": ALICE}), 401, "missing_api_key")  # not over HTTP
    denied = httpx.get(f"{server.url}/voices")
    assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Bearer")
    for headers in ({"Authorization": f"Bearer {ALICE}"}, {"X-API-Key": BOB}):
        response = httpx.post(url, json=SPEECH, headers=headers, timeout=60)
        assert response.status_code == 200 and len(response.content) > 24_000 * 2 // 2, response.text


def test_open_routes_need_no_key(keyed: tuple[Server, Path]) -> None:
    server, _ = keyed
    for path in ("/healthz", "/readyz", "/metrics", "/", "/web/app.js", "/docs", "/openapi.json"):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path
    preflight = httpx.options(
        f"{server.url}/v1/audio/speech",
        headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200
    # A 401 carries CORS headers, so the demo page (another origin too) can read it and ask for a key.
    denied = httpx.get(f"{server.url}/voices", headers={"Origin": "http://example.test"})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "*"


def test_the_openai_sdk_sends_its_key(keyed: tuple[Server, Path]) -> None:
    import openai

    server, _ = keyed
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=ALICE, max_retries=0)
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="Hi there.", response_format="pcm")
    assert len(audio.content) > 10_000
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-nope", max_retries=0).audio.speech.create(
            model="tts-1", voice="alloy", input="Hi."
        )


def test_websocket_keys(keyed: tuple[Server, Path]) -> None:
    server, _ = keyed
    ws_url = server.url.replace("http", "ws") + "/v1/tts/stream"

    async def main() -> None:
        for query, headers in (("", {}), ("?api_key=sk-wrong", {})):
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(ws_url + query, additional_headers=headers):
                    pass
            response = refused.value.response
            assert response.status_code == 401
            assert json.loads(response.body)["error"]["code"] in ("missing_api_key", "invalid_api_key")
        for query, headers in (
            (f"?api_key={ALICE}", {}),
            ("", {"X-API-Key": BOB}),
            ("", {"Authorization": f"Bearer {ALICE}"}),
        ):
            async with websockets.connect(ws_url + query, additional_headers=headers) as ws:
                assert ws.response.headers["x-request-id"]
                await ws.send(json.dumps({"type": "start"}))
                assert json.loads(await ws.recv())["type"] == "started"

    asyncio.run(main())


def test_streams_quota_and_metrics_by_key_name(keyed: tuple[Server, Path]) -> None:
    """alice may hold one stream: while her WebSocket is open a request gets 429 with Retry-After; bob is not
    affected; once it closes her requests pass again."""
    server, log_file = keyed
    url = f"{server.url}/v1/audio/speech"
    alice = {"Authorization": f"Bearer {ALICE}"}
    ws_url = server.url.replace("http", "ws") + f"/v1/tts/stream?api_key={ALICE}"

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            async with websockets.connect(ws_url) as ws:
                await ws.send(json.dumps({"type": "start"}))
                assert json.loads(await ws.recv())["type"] == "started"
                second = await client.post(url, json=SPEECH, headers=alice)
                error = error_of(second, 429, "quota_exceeded")
                assert int(second.headers["retry-after"]) >= 1 and "alice" in str(error["message"])
                assert (await client.post(url, json=SPEECH, headers={"X-API-Key": BOB})).status_code == 200
                assert server.metric("rtvoice_key_streams", {"key": "alice"}) == 1
                with pytest.raises(websockets.InvalidStatus) as refused:  # a second socket is a second stream
                    async with websockets.connect(ws_url):
                        pass
                assert refused.value.response.status_code == 429
        assert wait_for(lambda: server.metric("rtvoice_key_streams", {"key": "alice"}) == 0)

    asyncio.run(main())
    assert httpx.post(url, json=SPEECH, headers=alice, timeout=60).status_code == 200
    assert server.metric("rtvoice_key_rejected_total", {"key": "alice", "quota": "streams"}) >= 2
    assert server.metric("rtvoice_key_requests_total", {"key": "key-2"}) >= 1
    metrics = httpx.get(f"{server.url}/metrics").text
    log = log_file.read_text()
    for secret in (ALICE, BOB):
        assert secret not in metrics and secret not in log


def test_requests_per_minute(start_server: Callable[..., Server]) -> None:
    server = start_server(api_keys=f"carol:{ALICE}", key_requests_per_minute="3", warmup="false")
    headers = {"X-API-Key": ALICE}
    statuses = [httpx.get(f"{server.url}/voices", headers=headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    refused = httpx.get(f"{server.url}/voices", headers=headers)
    error_of(refused, 429, "quota_exceeded")
    assert 1 <= int(refused.headers["retry-after"]) <= 20  # one request comes back every 20 s
    assert server.metric("rtvoice_key_rejected_total", {"key": "carol", "quota": "requests_per_minute"}) == 1


def test_request_rate_refills_evenly() -> None:
    now = [0.0]
    rate = RequestRate(6, clock=lambda: now[0])
    assert [rate.take("k") for _ in range(6)] == [None] * 6
    assert rate.take("k") == pytest.approx(10.0)  # six a minute: one every 10 s
    now[0] = 9.0
    assert rate.take("k") == pytest.approx(1.0)
    now[0] = 10.0
    assert rate.take("k") is None and rate.take("other") is None
    now[0] = 1000.0  # a long pause refills to the bucket's size, not beyond
    assert [rate.take("k") for _ in range(7)].count(None) == 6


def test_key_names_and_whep_token() -> None:
    keys = parse_api_keys(f" ops:{ALICE} , {BOB} ")
    assert [(k.name, k.secret.decode()) for k in keys] == [("ops", ALICE), ("key-2", BOB)]
    assert "sk-" not in repr(keys)
    with pytest.raises(ValueError):
        parse_api_keys(f"a:{ALICE},b:{ALICE}")
    ring = KeyRing.from_settings(Settings(_env_file=None, whep_token="tok"))
    assert ring.required("/whep", "POST") and not ring.required("/voices", "GET")
    assert ring.match("tok", "/whep/abc") is not None and ring.match("tok", "/voices") is None
    assert not ring.required("/whep", "OPTIONS")


def test_open_server_beyond_loopback_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rtvoice.app.access"):
        warn_if_open(Settings(_env_file=None, host="127.0.0.1"), KeyRing([]))
        assert not caplog.records
        warn_if_open(Settings(_env_file=None, host="0.0.0.0"), KeyRing([]))
        assert "RTVOICE_API_KEYS is empty" in caplog.text
        caplog.clear()
        warn_if_open(Settings(_env_file=None, host="0.0.0.0"), KeyRing(parse_api_keys(ALICE)))
        assert not caplog.records


def test_metrics_can_require_a_key(start_server: Callable[..., Server]) -> None:
    server = start_server(api_keys=ALICE, metrics_require_key="true", warmup="false")
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers={"X-API-Key": ALICE}).status_code == 200
    assert httpx.get(f"{server.url}/readyz").status_code == 200


# -- request ids and the access line ------------------------------------------------------------------


def test_request_ids_and_the_access_line(keyed: tuple[Server, Path]) -> None:
    server, log_file = keyed
    headers = {"X-API-Key": ALICE, "X-Request-ID": "client-id.42"}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=SPEECH, headers=headers, timeout=60)
    assert response.status_code == 200 and response.headers["x-request-id"] == "client-id.42"
    for bad in (b"x" * 129, b"has space", "ünï".encode(), b"a\\b"):
        made = httpx.get(f"{server.url}/voices", headers={"X-API-Key": ALICE, "X-Request-ID": bad}).headers[
            "x-request-id"
        ]
        assert made.startswith("req_") and len(made) == 36
    error = httpx.post(
        f"{server.url}/v1/audio/speech",
        json={**SPEECH, "voice": "nobody"},
        headers={"X-API-Key": ALICE, "X-Request-ID": "bad-voice-1"},
    ).json()["error"]
    assert error["request_id"] == "bad-voice-1"

    def line_for(request_id: str) -> str:
        lines = [line for line in log_file.read_text().splitlines() if f"request_id={request_id}" in line]
        return lines[-1] if lines else ""

    assert wait_for(lambda: "rtvoice.access" in line_for("client-id.42"))
    line = line_for("client-id.42")
    assert '"POST /v1/audio/speech HTTP/1.1" 200 route=/v1/audio/speech key=alice ttfa_ms=' in line
    ttfa = float(line.split("ttfa_ms=")[1].split()[0])
    audio_s = float(line.split("audio_s=")[1].split()[0])
    assert 0 < ttfa < 10_000 and 0.5 < audio_s < 3, line
    # A WebSocket's access line shows its query without the key.
    ws_url = server.url.replace("http", "ws") + f"/v1/tts/stream?api_key={ALICE}&x=1"

    async def connect() -> str:
        async with websockets.connect(ws_url, additional_headers={"X-Request-ID": "ws-7"}) as ws:
            return str(ws.response.headers["x-request-id"])

    assert asyncio.run(connect()) == "ws-7"
    assert wait_for(lambda: "rtvoice.access" in line_for("ws-7"))
    assert '"WebSocket /v1/tts/stream?api_key=***&x=1" 101 route=/v1/tts/stream key=alice' in line_for("ws-7")


def test_grpc_calls_take_the_same_keys_quotas_and_request_ids(
    start_server: Callable[..., Server], cosyvoice_stubs: object
) -> None:
    """CosyVoice's gRPC service: the key in metadata (``authorization`` or ``x-api-key``), UNAUTHENTICATED
    without it, RESOURCE_EXHAUSTED past the key's quota shared with HTTP, and the request id back."""
    grpc = pytest.importorskip("grpc")
    from testkit.servers import free_port

    port = free_port()
    server = start_server(api_keys=f"dave:{ALICE}", key_max_streams="1", grpc_port=str(port), warmup="false")
    messages, services = cosyvoice_stubs  # type: ignore[misc]
    request = messages.Request()
    request.sft_request.CopyFrom(messages.sftRequest(tts_text="Keys over gRPC.", spk_id=""))

    def call(metadata: tuple[tuple[str, str], ...]) -> tuple[bytes, dict[str, str]]:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            responses = services.CosyVoiceStub(channel).Inference(request, metadata=metadata)
            audio = b"".join(response.tts_audio for response in responses)
            return audio, dict(responses.initial_metadata())

    for metadata in ((), (("authorization", "Bearer sk-wrong"),)):
        with pytest.raises(grpc.RpcError) as refused:
            call(metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    audio, initial = call((("x-api-key", ALICE), ("x-request-id", "grpc-1")))
    assert len(audio) > EMBEDDED_VOICE_RATE and initial["x-request-id"] == "grpc-1"
    audio, _ = call((("authorization", f"Bearer {ALICE}"),))
    assert len(audio) > EMBEDDED_VOICE_RATE

    async def while_a_socket_holds_the_stream() -> None:
        url = server.url.replace("http", "ws") + f"/v1/tts/stream?api_key={ALICE}"
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            await ws.recv()
            with pytest.raises(grpc.RpcError) as refused:
                await asyncio.to_thread(call, (("x-api-key", ALICE),))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(refused.value.trailing_metadata())["retry-after"] == "1"

    asyncio.run(while_a_socket_holds_the_stream())
