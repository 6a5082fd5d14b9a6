"""A WHEP player on aiortc, for the tests and the listener benchmark; and a tiny STUN responder.

The player offers recvonly audio and a DataChannel named "tts", POSTs the offer,
applies the answer, and logs every decoded audio frame with its arrival time
and level, so a test can say when speech started and stopped, and every RTP
packet (header and payload) as it arrives.

Like a browser, it offers Opus with ``useinbandfec=1`` (``fec``) and, with
``red``, RFC 2198 redundancy (``red/48000/2``, which it unwraps before aiortc,
which has no RED, decodes). ``drop`` makes a lossy path: a packet it picks is
captured (flagged ``dropped``) but never reaches aiortc, so the player's
receiver reports count it lost.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from aioice import stun
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from testkit.loss import StreamPacket, red_blocks
from testkit.polling import wait_for_async

RED_PAYLOAD_TYPE = 63
"""What Chrome offers RED as."""
SPEECH_RMS = 0.01
"""A decoded frame louder than this is speech; Opus-coded digital silence decodes far below it."""


@dataclass
class Frame:
    at: float
    """time.monotonic() when the decoded frame reached the player."""
    rms: float
    samples: int


@dataclass
class RtpArrival:
    at: float
    """time.monotonic() when the packet reached the player."""
    sequence_number: int
    timestamp: int
    marker: int
    payload_type: int = 0
    payload: bytes = b""
    dropped: bool = False
    """Dropped on the way (``WhepPlayer.drop``): aiortc never saw it."""


@dataclass
class WhepPlayer:
    base_url: str
    token: str | None = None
    voice: str | None = None
    datachannel: bool = True
    fec: bool = True
    """Offer Opus with ``useinbandfec=1``, as browsers do."""
    red: bool = False
    """Offer ``red/48000/2`` beside Opus, as Chrome does."""
    drop: Callable[[int], bool] | None = None
    """Given each audio packet's arrival index: whether it is lost on the way."""
    http: httpx.AsyncClient | None = None
    frames: list[Frame] = field(default_factory=list)
    rtp: list[RtpArrival] = field(default_factory=list)
    """Every audio RTP packet's header, in arrival order."""
    events: list[dict[str, Any]] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    """time.monotonic() when each event arrived."""
    location: str | None = None
    etag: str | None = None
    response: httpx.Response | None = None
    configuration: RTCConfiguration | None = None
    """The player's ICE configuration (TURN servers, relay only); none: host candidates only."""

    def __post_init__(self) -> None:
        self.pc = RTCPeerConnection(self.configuration or RTCConfiguration(iceServers=[]))
        self.channel: RTCDataChannel | None = None
        self._receiver: Any = None
        self._own_http = self.http is None
        self._reader: asyncio.Task[None] | None = None
        self._event_arrived = asyncio.Event()
        self._connected = asyncio.Event()
        self._channel_open = asyncio.Event()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def session_url(self) -> str:
        assert self.location is not None
        return httpx.URL(self.base_url).join(self.location).__str__()

    async def offer(self) -> str:
        """Gather and return the offer SDP (recvonly audio, and the "tts" DataChannel)."""
        receiver = self.pc.addTransceiver("audio", direction="recvonly").receiver
        self._receiver = receiver
        handle = receiver._handle_rtp_packet

        async def log_rtp(packet: Any, arrival_time_ms: int) -> None:  # the packets, before aiortc depacketizes
            dropped = self.drop is not None and self.drop(len(self.rtp))
            self.rtp.append(
                RtpArrival(
                    time.monotonic(),
                    packet.sequence_number,
                    packet.timestamp,
                    packet.marker,
                    packet.payload_type,
                    packet.payload,
                    dropped,
                )
            )
            if dropped:
                return
            if self.red and packet.payload_type == RED_PAYLOAD_TYPE:  # aiortc decodes the primary block
                packet.payload_type, packet.payload, _ = red_blocks(packet.payload)
            await handle(packet, arrival_time_ms=arrival_time_ms)

        receiver._handle_rtp_packet = log_rtp  # type: ignore[method-assign]  # wraps aiortc's handler to log headers
        if self.datachannel:
            self.channel = self.pc.createDataChannel("tts")
            self.channel.on("open", self._channel_open.set)
            self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return offer_with(self.pc.localDescription.sdp, fec=self.fec, red=self.red)

    async def start(self, timeout: float = 20.0) -> WhepPlayer:
        """Offer, POST, answer, and wait until media (and the DataChannel) are up."""
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=timeout)
        sdp = await self.offer()
        params = {"voice": self.voice} if self.voice else None
        response = await self.http.post(
            f"{self.base_url}/whep",
            content=sdp,
            params=params,
            headers={"Content-Type": "application/sdp", **self.headers},
        )
        self.response = response
        if response.status_code != 201:
            raise RuntimeError(f"POST /whep answered {response.status_code}: {response.text}")
        self.location = response.headers["location"]
        self.etag = response.headers.get("etag")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        if self.red:  # aiortc routes RTP by the payload types it negotiated, and it knows no RED: route it too
            router = self._receiver.transport._rtp_router
            router.payload_type_table.setdefault(RED_PAYLOAD_TYPE, set()).add(self._receiver)
        await asyncio.wait_for(self._connected.wait(), timeout)
        if self.channel is not None:
            await asyncio.wait_for(self._channel_open.wait(), timeout)
        return self

    # -- media and events -------------------------------------------------------------------------

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self._connected.set()

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio":
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: Any) -> None:
        try:
            while True:
                frame = await track.recv()
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                self.frames.append(Frame(time.monotonic(), float(np.sqrt(np.mean(pcm * pcm))), frame.samples))
        except (MediaStreamError, asyncio.CancelledError):
            pass

    def _on_message(self, data: str | bytes) -> None:
        self.events.append(json.loads(data))
        self.event_times.append(time.monotonic())
        self._event_arrived.set()

    def send(self, message: dict[str, Any] | str) -> float:
        """Send on the DataChannel; returns the monotonic time it left."""
        assert self.channel is not None
        self.channel.send(message if isinstance(message, str) else json.dumps(message))
        return time.monotonic()

    async def event(
        self, kind: str, request_id: str | None = None, timeout: float = 30.0, start: int = 0
    ) -> dict[str, Any]:
        """The first event of ``kind`` (for ``request_id``) from index ``start`` on, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for item in self.events[start:]:
                if item.get("type") == kind and (request_id is None or item.get("request_id") == request_id):
                    return item
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind!r} event; got {self.events}")
            self._event_arrived.clear()
            try:
                await asyncio.wait_for(self._event_arrived.wait(), left)
            except TimeoutError:
                pass

    def first_speech_after(self, t: float, threshold: float = SPEECH_RMS) -> Frame | None:
        return next((f for f in self.frames if f.at >= t and f.rms > threshold), None)

    async def wait_for_speech(self, after: float, timeout: float = 20.0) -> Frame:
        if not await wait_for_async(lambda: self.first_speech_after(after) is not None, timeout, interval=0.01):
            raise TimeoutError(f"no speech within {timeout} s ({len(self.frames)} frames received)")
        speech = self.first_speech_after(after)
        assert speech is not None  # frames are only ever appended: the one found is still there
        return speech

    async def wait_for_media_until(self, t: float, timeout: float = 20.0) -> None:
        """Until a frame played at or after monotonic time ``t`` has arrived (the track sends one every 20 ms,
        speech or silence, so this is the media's own clock)."""
        if not await wait_for_async(lambda: bool(self.frames) and self.frames[-1].at >= t, timeout, interval=0.01):
            raise TimeoutError(f"no frame at or after {t} within {timeout} s ({len(self.frames)} frames received)")

    def frames_between(self, start: float, end: float) -> list[Frame]:
        return [f for f in self.frames if start <= f.at < end]

    def stream(self) -> list[StreamPacket]:
        """Every audio packet that arrived, dropped ones too, in sequence order (for ``testkit/loss.py``)."""
        first = self.rtp[0].sequence_number if self.rtp else 0
        ordered = sorted(self.rtp, key=lambda p: (p.sequence_number - first) & 0xFFFF)
        return [StreamPacket(p.timestamp, p.payload_type, p.payload) for p in ordered]

    async def status(self) -> dict[str, Any]:
        """The session's ``GET /whep/{id}/status``: what it sends now and what this player last reported."""
        assert self.http is not None
        response = await self.http.get(f"{self.session_url}/status", headers=self.headers)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    # -- ending -----------------------------------------------------------------------------------

    async def delete(self) -> httpx.Response:
        assert self.http is not None
        return await self.http.delete(self.session_url, headers=self.headers)

    async def close(self, delete: bool = True) -> None:
        try:
            if delete and self.location is not None and self.http is not None:
                await self.delete()
        finally:
            await self.pc.close()
            if self._reader is not None:
                self._reader.cancel()
            if self._own_http and self.http is not None:
                await self.http.aclose()


def offer_with(sdp: str, fec: bool, red: bool) -> str:
    """aiortc's offer with Opus's ``useinbandfec=1`` and, after Opus, ``red/48000/2`` carrying Opus (Chrome's)."""
    lines = sdp.split("\r\n")
    opus = next(line.split()[0].split(":")[1] for line in lines if line.endswith(" opus/48000/2"))
    out: list[str] = []
    for line in lines:
        if line.startswith("m=audio ") and red:
            parts = line.split()
            parts.insert(parts.index(opus) + 1, str(RED_PAYLOAD_TYPE))
            line = " ".join(parts)
        out.append(line)
        if line == f"a=rtpmap:{opus} opus/48000/2":
            if fec:
                out.append(f"a=fmtp:{opus} minptime=10;useinbandfec=1")
            if red:
                out += [f"a=rtpmap:{RED_PAYLOAD_TYPE} red/48000/2", f"a=fmtp:{RED_PAYLOAD_TYPE} {opus}/{opus}"]
    return "\r\n".join(out)


class StunResponder:
    """Answers STUN Binding requests on a loopback UDP port (a stand-in for a STUN server), in a thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.address = self.sock.getsockname()
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"stun:{self.address[0]}:{self.address[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except OSError:
                continue
            try:
                request = stun.parse_message(data)
            except ValueError:
                continue
            if request.message_method == stun.Method.BINDING and request.message_class == stun.Class.REQUEST:
                self.requests += 1
                response = stun.Message(stun.Method.BINDING, stun.Class.RESPONSE, request.transaction_id)
                response.attributes["XOR-MAPPED-ADDRESS"] = addr
                self.sock.sendto(bytes(response), addr)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


async def refused_then_spoken(base_url: str, text: str, code: str) -> None:
    """A player whose request with ``text`` gets an ``error`` with ``code``, and whose next one is spoken whole:
    the session outlives the failure."""
    player = await WhepPlayer(base_url).start()
    try:
        player.send({"type": "tts_request", "text": text, "request_id": "refused"})
        assert (await player.event("error", timeout=30))["code"] == code
        player.send({"type": "tts_request", "text": "Then this one plays.", "request_id": "spoken"})
        assert (await player.event("done", "spoken", timeout=30))["audio_s"] > 0.5
    finally:
        await player.close()
