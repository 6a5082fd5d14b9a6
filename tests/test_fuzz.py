"""Fuzzing (short runs): the OpenAPI routes with schemathesis, WebSocket frames, DataChannel messages, SDP and
trickle bodies with hypothesis. Bad input gets errors for its sender, never a 5xx, an internal error or a
close 1011, and a client streaming at the same time hears exactly what it would have heard alone.

The CosyVoice2 routes with the fixture loaded: ``tests/cosyvoice2/test_fuzz_openapi.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.polling import wait_for_async
from testkit.whep_client import WhepPlayer
from tests.audio import snr_db
from tests.conftest import Server
from tests.openapi_fuzz import fuzz_openapi
from tests.test_whep import offer_sdp

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)


# -- OpenAPI ----------------------------------------------------------------------------------------------


def test_openapi_routes_never_answer_5xx(server: Server) -> None:
    statuses = fuzz_openapi(server.url, max_examples=6)
    assert sum(statuses.values()) > 100 and any(200 <= status < 300 for status in statuses), statuses
    assert any(400 <= status < 500 for status in statuses), statuses


# -- a loop of its own, so that clients live across hypothesis examples ------------------------------------


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
message_types = st.sampled_from(["start", "text", "flush", "cancel", "end", "tts_request", "", "START", "x" * 300])
field_values = json_values | st.sampled_from(["en_US-joe-medium", "alloy", "pcm_s16le", 16000, 48000, 7, -1, 1e308])
objects = st.builds(
    lambda kind, fields: json.dumps({"type": kind, **fields}),
    message_types,
    st.dictionaries(
        st.sampled_from(
            ["text", "voice", "sample_rate", "encoding", "speed", "seed", "speaker_id", "request_id", "type"]
        ),
        field_values,
        max_size=4,
    ),
)
frames = st.one_of(
    objects,
    json_values.map(json.dumps),
    st.text(max_size=80),
    st.binary(max_size=300),
    st.integers(5_000, 40_000).map(lambda n: json.dumps({"type": "text", "text": "a" * n})),
)


# -- WebSocket --------------------------------------------------------------------------------------------


class Victim:
    """A client speaking the same seeded text over and over while the fuzz runs; every utterance must be whole."""

    TEXT = "The fuzz next door must not touch a single sample of this sentence."

    def __init__(self, url: str, reference: np.ndarray) -> None:
        self.url = url
        self.reference = reference
        self.utterances: list[np.ndarray] = []
        self.problems: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with websockets.connect(self.url) as ws:
            await ws.send(json.dumps({"type": "start", "seed": 3}))
            await ws.recv()
            while not self.stop.is_set():
                await ws.send(json.dumps({"type": "text", "text": self.TEXT}))
                await ws.send(json.dumps({"type": "flush"}))
                pcm = b""
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        pcm += message
                    elif json.loads(message)["type"] == "done":
                        break
                    elif json.loads(message)["type"] == "error":
                        self.problems.append(message)
                self.utterances.append(np.frombuffer(pcm, dtype="<i2"))


async def reference_pcm(url: str, text: str) -> np.ndarray:
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "seed": 3}))
        await ws.send(json.dumps({"type": "text", "text": text}))
        await ws.send(json.dumps({"type": "end"}))
        pcm = b"".join([m async for m in ws if isinstance(m, bytes)])
    return np.frombuffer(pcm, dtype="<i2")


@pytest.fixture(scope="module")
def fuzzed(start_server: Callable[..., Server]) -> Server:
    return start_server(ws_max_message_bytes=str(WS_LIMIT), whep_max_message_bytes=str(WS_LIMIT), warmup="false")


PROBE_SEED = 987_654_321
WS_LIMIT = 16_384


async def fuzz_socket(url: str, sent: list[str | bytes]) -> None:
    """Send the frames, then a probe ``start``: its ``started`` comes once everything before it was handled."""
    async with websockets.connect(url, max_size=None) as ws:
        try:
            for frame in sent:
                await ws.send(frame)
            await ws.send(json.dumps({"type": "start", "seed": PROBE_SEED}))
            while True:
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, bytes):
                    continue
                event = json.loads(message)
                assert event["type"] in ("started", "audio_start", "segment_done", "done", "cancelled", "error"), event
                if event["type"] == "error":
                    assert isinstance(event["code"], str) and event["code"] != "internal_error", event
                    assert isinstance(event["message"], str)
                if event["type"] == "started" and event["seed"] == PROBE_SEED:
                    return
        except websockets.ConnectionClosed as closed:
            # 'end' closes normally; an oversized frame is refused with 1009 (the client may still be writing it
            # when the server hangs up, and then never reads the close frame); nothing fails with 1011.
            oversized = any(len(frame.encode() if isinstance(frame, str) else frame) > WS_LIMIT for frame in sent)
            if closed.rcvd is None:
                assert oversized, closed
            else:
                assert closed.rcvd.code in ((1000, 1009) if oversized else (1000,)), closed.rcvd


def test_websocket_fuzz_errors_for_the_sender_only(fuzzed: Server, loop: LoopThread) -> None:
    url = fuzzed.url.replace("http", "ws") + "/v1/tts/stream"
    victim = Victim(url, loop.run(reference_pcm(url, Victim.TEXT)))
    running = asyncio.run_coroutine_threadsafe(victim.run(), loop.loop)

    @FUZZ
    @given(st.lists(frames, min_size=1, max_size=6))
    def fuzz(sent: list[str | bytes]) -> None:
        loop.run(fuzz_socket(url, sent))

    try:
        fuzz()
        assert loop.run(wait_for_async(lambda: len(victim.utterances) >= 2, 60))
    finally:
        loop.loop.call_soon_threadsafe(victim.stop.set)
        running.result(60)
    assert not victim.problems
    for pcm in victim.utterances:
        assert len(pcm) == len(victim.reference) and snr_db(victim.reference, pcm) > 40
    assert httpx.get(f"{fuzzed.url}/readyz").status_code == 200


# -- DataChannel ------------------------------------------------------------------------------------------


def test_datachannel_fuzz_errors_for_the_sender_only(fuzzed: Server, loop: LoopThread) -> None:
    victim = loop.run(WhepPlayer(fuzzed.url).start())
    player = loop.run(WhepPlayer(fuzzed.url).start())
    # aiortc objects belong to their loop: send from it.
    loop.loop.call_soon_threadsafe(
        victim.send, {"type": "tts_request", "text": " ".join([Victim.TEXT] * 3), "request_id": "victim"}
    )
    probes = iter(range(10**6))

    async def fuzz_channel(sent: list[str | bytes]) -> None:
        start = len(player.events)
        for message in sent:
            player.channel.send(message)
        probe = f"probe-{next(probes)}"
        player.send({"type": "cancel"})
        player.send({"type": "tts_request", "text": "Probe.", "request_id": probe})
        await player.event("accepted", probe, timeout=30, start=start)
        player.send({"type": "cancel"})
        for event in player.events[start:]:
            assert event["type"] in ("accepted", "audio_start", "done", "cancelled", "error"), event
            if event["type"] == "error":
                assert event["code"] != "internal_error" and isinstance(event["message"], str), event

    @FUZZ
    @given(st.lists(frames, min_size=1, max_size=5))
    def fuzz(sent: list[str | bytes]) -> None:
        loop.run(fuzz_channel(sent))

    try:
        fuzz()
        done = loop.run(victim.event("done", "victim", timeout=60), timeout=90)
        assert done["audio_s"] > 5 and not [e for e in victim.events if e["type"] == "error"]
        assert player.pc.connectionState == "connected"
    finally:
        loop.run(player.close())
        loop.run(victim.close())


# -- SDP and trickle bodies -------------------------------------------------------------------------------


sdp_lines = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "v=0",
            "o=- 0 0 IN IP4 127.0.0.1",
            "s=-",
            "t=0 0",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
            "m=audio 0 RTP/AVP 0",
            "m=video 9 UDP/TLS/RTP/SAVPF 96",
            "c=IN IP4 0.0.0.0",
            "a=recvonly",
            "a=sendonly",
            "a=rtpmap:111 opus/48000/2",
            "a=ice-ufrag:abcd",
            "a=ice-pwd:0123456789012345678901",
            "a=fingerprint:sha-256 00:11",
            "a=setup:actpass",
            "a=mid:0",
            "a=group:BUNDLE 0",
            "a=candidate:1 1 udp 1 127.0.0.1 9 typ host",
            "a=candidate:x",
            "a=end-of-candidates",
            "a=rtcp-mux",
            "a=ice-ufrag:",
            "a=mid:",
            "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        ]
    ),
)
bodies = st.lists(sdp_lines, max_size=14).map("\r\n".join) | st.binary(max_size=200).map(lambda b: b.decode("latin-1"))


def test_malformed_sdp_and_trickle_bodies_get_4xx(fuzzed: Server, loop: LoopThread) -> None:
    async def session() -> tuple[Any, str]:
        pc, sdp = await offer_sdp()
        created = httpx.post(f"{fuzzed.url}/whep", content=sdp, headers={"Content-Type": "application/sdp"}, timeout=30)
        assert created.status_code == 201
        return pc, f"{fuzzed.url}{created.headers['location']}"

    pc, location = loop.run(session())

    @FUZZ
    @given(bodies, bodies)
    def fuzz(offer: str, fragment: str) -> None:
        posted = httpx.post(
            f"{fuzzed.url}/whep",
            content=offer.encode("utf-8", "surrogatepass"),
            headers={"Content-Type": "application/sdp"},
            timeout=30,
        )
        assert posted.status_code in (201, 400, 413), (posted.status_code, posted.text[:200])
        if posted.status_code == 201:  # an offer that happens to be usable: drop its session
            httpx.delete(f"{fuzzed.url}{posted.headers['location']}")
        else:
            assert posted.json()["error"]["code"]
        patched = httpx.patch(
            location,
            content=fragment.encode("utf-8", "surrogatepass"),
            headers={"Content-Type": "application/trickle-ice-sdpfrag"},
            timeout=30,
        )
        assert patched.status_code in (204, 400, 413, 422), (patched.status_code, patched.text[:200])

    try:
        fuzz()
    finally:
        httpx.delete(location)
        loop.run(pc.close())
