"""WHEP under packet loss: Opus in-band FEC and RED as the offer allows, and adaptation to receiver reports.

Real server, real voice, aiortc players. The FEC check captures the RTP a session
sends, drops packets from it offline (seeded random and Gilbert–Elliott bursts)
and plays the rest out with libopus, recovering lost frames from the next
packet's FEC; the adaptation check drops packets on their way into the player,
whose receiver reports then tell the server. The server's own send-loss hook
(``RTVOICE_WHEP_SEND_LOSS``, what the browser benchmark drops packets with) is
checked the same way: gaps in what the player receives, and the session adapting.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.stats import RTCRemoteInboundRtpStreamStats

from rtvoice.app.whep.adaptation import (
    PROFILES,
    RECOVER_REPORTS,
    LinkMonitor,
    LossBuckets,
    ReceiverReport,
    report_of,
)
from rtvoice.app.whep.marker import SendLoss
from rtvoice.app.whep.mediastreams import SpeechTrack
from rtvoice.app.whep.red import red_payload
from rtvoice.engine.audio.encoding import MAX_SWITCH_WAIT_FRAMES, OpusPacketEncoder, OpusTuning
from testkit.loss import StreamPacket, gilbert_elliott, lossless, playout, random_losses, red_blocks
from testkit.opus import OpusDecoder
from testkit.whep_client import RED_PAYLOAD_TYPE, WhepPlayer, offer_with
from tests.conftest import Server

SDP = {"Content-Type": "application/sdp"}
PASSAGE = "When the committee finally gathered in the old library on a rainy Thursday afternoon, nobody spoke."
FRAME = 960
SEEDS = 5
"""Loss patterns per condition."""
MAX_DELAY = 700
"""Samples of codec delay searched for when decoded audio is compared with its input."""
CLEAN, _, HEAVY = PROFILES


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


def audio_section(sdp: str) -> str:
    return sdp.split("m=audio", 1)[1].split("\nm=", 1)[0]


# -- units: RED payloads, loss buckets, encoder switches -----------------------------------------------


def test_red_payload_carries_the_previous_packet() -> None:
    payload = red_payload(111, b"primary", b"earlier", 960)
    assert red_blocks(payload) == (111, b"primary", [(111, 960, b"earlier")])
    assert red_blocks(red_payload(111, b"first", None, 0)) == (111, b"first", [])
    # An offset or a block the header cannot say: the primary alone.
    assert red_blocks(red_payload(111, b"p", b"old", 1 << 14)) == (111, b"p", [])
    assert red_blocks(red_payload(111, b"p", b"x" * 1024, 960)) == (111, b"p", [])


def test_loss_buckets_step_up_at_once_and_down_after_calm() -> None:
    buckets = LossBuckets()
    assert buckets.observe(0.0) is None and buckets.profile == CLEAN
    assert buckets.observe(0.02) is None  # smoothed 1%: below the first threshold
    assert buckets.observe(0.25) == HEAVY  # smoothed 13%: straight to the heaviest bucket
    # Loss hovering around a threshold never flaps back: stepping down needs a calm run.
    for loss in [0.08, 0.04, 0.08, 0.04, 0.08]:
        assert buckets.observe(loss) is None and buckets.profile == HEAVY
    changes = [buckets.observe(0.0) for _ in range(12)]
    stepped = [c.name for c in changes if c is not None]
    assert stepped == ["lossy", "clean"]
    assert changes.index(PROFILES[1]) >= RECOVER_REPORTS - 1


def test_link_monitor_takes_each_receiver_report_once() -> None:
    reports: list[ReceiverReport] = []
    changes: list[str] = []
    monitor = LinkMonitor(lambda: None, reports.append, lambda profile, _, __: changes.append(profile.name))

    def remote_inbound(at: datetime, fraction_lost: int, jitter: int) -> dict[str, Any]:
        entry = RTCRemoteInboundRtpStreamStats(
            timestamp=at,
            type="remote-inbound-rtp",
            id="r",
            ssrc=1,
            kind="audio",
            transportId="t",
            packetsReceived=100,
            packetsLost=10,
            jitter=jitter,
            roundTripTime=0.05,
            fractionLost=fraction_lost,
        )
        return {"outbound": object(), "r": entry}

    monitor.poll(report_of({}))  # no report yet: the defaults stay
    assert reports == [] and monitor.buckets.profile == CLEAN
    first = datetime(2026, 1, 1, 12, 0, 0)
    monitor.poll(report_of(remote_inbound(first, 64, 480)))  # RTCP's 64/256 lost, 480 ticks of 48 kHz
    monitor.poll(report_of(remote_inbound(first, 64, 480)))  # the same report read again
    assert reports == [ReceiverReport(0.25, 0.01, 0.05)] and monitor.reports == 1
    assert changes == ["heavy"]


def tone(frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME) / 48_000
    return (np.sin(2 * np.pi * 330 * t) * 6000 + np.sin(2 * np.pi * 1250 * t) * 2000).astype(np.int16)


def decoded(
    encoder: OpusPacketEncoder, signal: np.ndarray, retune_at: int, tuning: OpusTuning
) -> tuple[list[np.ndarray], list[int]]:
    """Each frame's decoded samples, the encoder retuned before frame ``retune_at``; and the frames it switched at."""
    decoder = OpusDecoder()
    out, switched_at = [], []
    for i in range(len(signal) // FRAME):
        if i == retune_at:
            encoder.retune(tuning)
        before = encoder.switches
        out.append(decoder.decode(encoder.encode(signal[i * FRAME : (i + 1) * FRAME])).astype(np.float64))
        if encoder.switches != before:
            switched_at.append(i)
    return out, switched_at


def snr_db(frames: list[np.ndarray], signal: np.ndarray, lo: int, hi: int) -> float:
    """How closely frames lo..hi follow the input, at the codec's delay (found by correlation)."""
    got = np.concatenate(frames[lo:hi])
    source = signal.astype(np.float64)
    reach = min(MAX_DELAY, lo * FRAME)
    correlation = np.correlate(source[lo * FRAME - reach : hi * FRAME], got, mode="valid")  # lag `reach` - index
    delay = reach - int(np.argmax(correlation))
    ref = source[lo * FRAME - delay : hi * FRAME - delay]
    return float(10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2)))


def test_a_new_encoder_takes_over_at_a_pause_without_a_seam() -> None:
    start, after = OpusTuning(40_000, 5, fec=True), OpusTuning(24_000, 25, fec=True)
    signal = np.concatenate([tone(20), np.zeros(4 * FRAME, np.int16), tone(20)])
    steady, _ = decoded(OpusPacketEncoder(48_000, FRAME, after), signal, 99, after)
    encoder = OpusPacketEncoder(48_000, FRAME, start)
    switched, switched_at = decoded(encoder, signal, 5, after)
    # The retune waits for the pause: the old encoder's tail and the new one's head are both silent there.
    assert switched_at == [21] and encoder.tuning == after
    assert [len(f) for f in switched] == [FRAME] * 44  # one packet per frame: no gap in time
    assert max(np.abs(f).max() for f in switched[22:24]) < 50  # the pause stays silent: no click
    # After it the new encoder's speech decodes as well as from one tuned so from the start.
    assert snr_db(switched, signal, 26, 44) > snr_db(steady, signal, 26, 44) - 2


def test_a_retune_without_a_pause_switches_within_a_second() -> None:
    after = OpusTuning(24_000, 25, fec=True)
    signal = tone(60)
    encoder = OpusPacketEncoder(48_000, FRAME, OpusTuning(40_000, 5, fec=True))
    switched, switched_at = decoded(encoder, signal, 5, after)
    assert switched_at == [5 + MAX_SWITCH_WAIT_FRAMES]
    steady, _ = decoded(OpusPacketEncoder(48_000, FRAME, after), signal, 99, after)
    assert snr_db(switched, signal, 57, 60) > snr_db(steady, signal, 57, 60) - 3
    assert snr_db(switched, signal, 55, 57) > 5  # the frame taking over decodes as the tone, not as noise


class SteppingClock:
    """The track's clock and sleep: each sleep moves time on by exactly what was asked."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_track_wraps_packets_in_red_only_while_told_and_marks_their_type() -> None:
    async def main() -> None:
        time = SteppingClock()
        track = SpeechTrack(clock=time.clock, sleep=time.sleep)
        track.negotiated(fec=True, red_payload_types=(RED_PAYLOAD_TYPE, 111))
        track.tune(CLEAN.bit_rate, CLEAN.packet_loss_percent, CLEAN.red)
        assert track.tuning == OpusTuning(CLEAN.bit_rate, CLEAN.packet_loss_percent, fec=True)
        assert track.encoder_switches == 0  # tuned before the first packet: no switch
        track.activate()
        signal = tone(12)
        for i in range(12):
            track.push(signal[i * FRAME : (i + 1) * FRAME])
        plain = [await track.recv() for _ in range(3)]
        track.tune(HEAVY.bit_rate, HEAVY.packet_loss_percent, HEAVY.red)
        wrapped = [await track.recv() for _ in range(3)]
        assert all(track.payload_type_of(p.pts) is None for p in plain)
        assert all(track.payload_type_of(p.pts) == RED_PAYLOAD_TYPE for p in wrapped)
        previous = bytes(plain[-1])
        for packet in wrapped:
            primary_type, primary, blocks = red_blocks(bytes(packet))
            assert primary_type == 111 and blocks == [(111, FRAME, previous)]
            previous = primary
        track.stop()

    run(main())


# -- SDP: what the answer says for what the offer allows -------------------------------------------------


@pytest.mark.parametrize(("fec", "red"), [(False, False), (True, False), (False, True), (True, True)])
def test_answer_follows_the_offer_fec_and_red(server: Server, fec: bool, red: bool) -> None:
    async def main() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                offer = offer_with(pc.localDescription.sdp, fec=fec, red=red)
                response = await http.post(f"{server.url}/whep", content=offer, headers=SDP)
                assert response.status_code == 201, response.text
                audio = audio_section(response.text)
                opus = re.search(r"a=rtpmap:(\d+) opus/48000/2", audio)
                assert opus is not None
                pt = opus.group(1)
                assert (f"a=fmtp:{pt} minptime=10;useinbandfec=1" in audio) == fec
                m_line = audio.split("\r\n", 1)[0]
                if red:
                    assert m_line.endswith(f" {pt} {RED_PAYLOAD_TYPE}")  # Opus first: RED rides on it
                    assert f"a=rtpmap:{RED_PAYLOAD_TYPE} red/48000/2\r\na=fmtp:{RED_PAYLOAD_TYPE} {pt}/{pt}" in audio
                else:
                    assert m_line.endswith(f" {pt}") and "red/" not in audio
                session = f"{server.url}{response.headers['location']}"
                status = (await http.get(f"{session}/status")).json()
                assert status["profile"] == "clean" and status["bit_rate"] == CLEAN.bit_rate
                assert status["fec"] == fec and status["fec_loss_percent"] == CLEAN.packet_loss_percent
                assert status["red"] == {"negotiated": red, "active": False}  # RED waits for reported loss
                assert status["last_report"] is None
                assert (await http.delete(session)).status_code == 200
                assert (await http.get(f"{session}/status")).status_code == 404
        finally:
            await pc.close()

    run(main())


def test_red_naming_another_codec_is_not_answered(server: Server) -> None:
    async def main() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        try:
            offer = offer_with(pc.localDescription.sdp, fec=True, red=True)
            offer = re.sub(rf"a=fmtp:{RED_PAYLOAD_TYPE} \d+/\d+", f"a=fmtp:{RED_PAYLOAD_TYPE} 0/0", offer)
            async with httpx.AsyncClient(timeout=30) as http:
                response = await http.post(f"{server.url}/whep", content=offer, headers=SDP)
                assert response.status_code == 201, response.text
                assert "red/" not in audio_section(response.text)
                await http.delete(f"{server.url}{response.headers['location']}")
        finally:
            await pc.close()

    run(main())


# -- FEC: what a lossy path costs a player, with and without ----------------------------------------------


def test_fec_cuts_concealed_speech_threefold(server: Server) -> None:
    async def speak(player: WhepPlayer) -> None:
        await player.start()
        player.send({"type": "tts_request", "text": PASSAGE, "request_id": "p", "seed": 7})
        done = await player.event("done", "p", timeout=60)
        first = await player.wait_for_speech(0)
        await player.wait_for_media_until(first.at + done["audio_s"] + 0.2)

    async def main() -> tuple[list[StreamPacket], list[StreamPacket]]:
        with_fec, without = WhepPlayer(server.url, fec=True), WhepPlayer(server.url, fec=False)
        try:
            await asyncio.gather(speak(with_fec), speak(without))
            return with_fec.stream(), without.stream()
        finally:
            await asyncio.gather(with_fec.close(), without.close())

    on, off = run(main())
    # Each loss condition over a few seeded patterns: the two sessions' speech starts at different packets, so one
    # pattern can hit more speech in one stream than in the other.
    conditions = {
        "random 10%": lambda n, seed: random_losses(n, 0.10, seed),
        "bursts 10%": lambda n, seed: gilbert_elliott(n, 0.10, mean_burst=2.5, seed=seed),
    }
    concealed: dict[str, list[int]] = {}
    for name, lost_of in conditions.items():
        row = []
        for packets, fec in [(on, True), (off, False)]:
            reference = lossless(packets)
            total = recovered = 0
            for seed in range(SEEDS):
                result = playout(packets, lost_of(len(packets), seed), fec=True, reference=reference)
                total += result.concealed_speech_samples
                recovered += result.recovered_fec
            assert (recovered > 0) == fec
            row.append(total)
        concealed[name] = row
        print(f"\n{name}, {SEEDS} patterns: concealed speech samples with FEC {row[0]}, without {row[1]}")
    random_on, random_off = concealed["random 10%"]
    assert random_off > SEEDS * 15 * FRAME  # the passage lost real speech
    assert random_on * 3 <= random_off
    bursts_on, bursts_off = concealed["bursts 10%"]
    assert bursts_on < bursts_off  # FEC reaches one packet back: it helps less with bursts, but it helps


# -- adaptation: a lossy path into the player, then a clean one ---------------------------------------------


def test_adaptation_steps_down_under_loss_and_back_up(server: Server) -> None:
    rng = random.Random(5)
    lossy = {"on": False}

    async def main() -> None:
        switches_before = server.metric("rtvoice_whep_encoder_switches_total")
        reports_before = server.metric("rtvoice_whep_reported_loss_ratio_count")
        player = WhepPlayer(server.url, red=True, drop=lambda _: lossy["on"] and rng.random() < 0.25)
        await player.start()
        try:
            player.send({"type": "tts_request", "text": "Listening.", "request_id": "a"})
            await player.event("done", "a", timeout=60)
            assert (await player.status())["profile"] == "clean"
            lossy["on"] = True
            heavy_at = len(player.rtp)

            async def profile_is(name: str) -> bool:
                return (await player.status())["profile"] == name

            assert await wait_for_async_status(lambda: profile_is("heavy"), 30), await player.status()
            status = await player.status()
            assert status["bit_rate"] == HEAVY.bit_rate and status["fec_loss_percent"] == HEAVY.packet_loss_percent
            assert status["fec"] and status["red"] == {"negotiated": True, "active": True}
            assert status["smoothed_loss"] > 0.05, status
            # RED reaches the player: each packet's redundant block is the packet sent before it, one frame earlier
            # (more after a stall, when the track skips RTP time rather than send a burst), and says how much earlier.
            await player.wait_for_media_until(player.frames[-1].at + 0.3)
            sent_red = [i for i in range(heavy_at, len(player.rtp)) if player.rtp[i].payload_type == RED_PAYLOAD_TYPE]
            assert len(sent_red) >= 10
            for index in sent_red[-10:]:
                packet, before = player.rtp[index], player.rtp[index - 1]
                primary_type, primary, blocks = red_blocks(packet.payload)
                offset = (packet.timestamp - before.timestamp) & 0xFFFFFFFF
                assert primary and [b[:2] for b in blocks] == [(primary_type, offset)] and offset % FRAME == 0
                assert blocks[0][2] == (
                    red_blocks(before.payload)[1] if before.payload_type == RED_PAYLOAD_TYPE else before.payload
                )

            lossy["on"] = False
            clean_at = len(player.rtp)
            # What the player lost on the way while RED was on comes back from the packets after it.
            lossy_run = [p for p in player.rtp[heavy_at:clean_at] if p.payload_type == RED_PAYLOAD_TYPE]
            lost = np.array([p.dropped for p in lossy_run])
            packets = [StreamPacket(p.timestamp, p.payload_type, p.payload) for p in lossy_run]
            recovered = playout(packets, lost, fec=True, red_type=RED_PAYLOAD_TYPE)
            assert lost.any() and recovered.recovered_red >= lost[:-1].sum() // 2
            assert await wait_for_async_status(lambda: profile_is("clean"), 40), await player.status()
            status = await player.status()
            assert status["bit_rate"] == CLEAN.bit_rate and status["red"]["active"] is False
            await player.wait_for_media_until(player.frames[-1].at + 0.3)
            assert player.rtp[-1].payload_type != RED_PAYLOAD_TYPE and len(player.rtp) > clean_at
            assert status["encoder_switches"] >= 2  # down to 24 kbit/s, back up (via 32)
            assert server.metric("rtvoice_whep_encoder_switches_total") - switches_before >= 2
            assert server.metric("rtvoice_whep_reported_loss_ratio_count") - reports_before >= 5
        finally:
            await player.close()

    run(main())


# -- the send-loss hook: a lossy path to any player, browsers too, made by the server -------------------------


def test_send_loss_is_seeded_per_session_and_lets_retransmissions_pass() -> None:
    def pattern(seed: str) -> list[bool]:
        loss = SendLoss(0.2, seed)
        return [loss.drops(n & 0xFFFF) for n in range(65_000, 67_000)]  # the sequence number wraps past 2**16

    drops = pattern("session-a")
    assert 0.17 < sum(drops) / len(drops) < 0.23
    assert pattern("session-a") == drops and pattern("session-b") != drops
    loss = SendLoss(0.99, "s")
    assert loss.drops(10) and loss.drops(11) and loss.dropped == 2
    assert not loss.drops(10) and not loss.drops(11)  # sent again: a retransmission, which goes
    assert loss.drops(12)


def test_send_loss_hook_drops_packets_and_the_session_adapts(start_server: Callable[..., Server]) -> None:
    lossy = start_server(whep_send_loss="0.2", warmup="false")

    async def main() -> None:
        player = WhepPlayer(lossy.url)
        await player.start()
        try:
            player.send({"type": "tts_request", "text": PASSAGE, "request_id": "p"})
            await player.event("done", "p", timeout=60)

            async def adapted() -> bool:
                return (await player.status())["profile"] != "clean"

            assert await wait_for_async_status(adapted, 30), await player.status()
            status = await player.status()
            # The loss the session adapted to, smoothed over its reports: one report covers 25-75 packets, and the
            # newest alone fell under 5% about once in 250 runs at a 20% loss.
            assert status["profile"] in ("lossy", "heavy") and status["smoothed_loss"] > 0.05, status
            await player.wait_for_media_until(player.frames[-1].at + 4)  # settled silence goes on: more packets
            # What arrived has gaps in its sequence numbers, about a fifth of what was sent.
            steps = np.diff([p.sequence_number for p in player.rtp]) & 0xFFFF
            assert steps.min() >= 1  # nothing twice, nothing out of order on loopback
            missing = int((steps - 1).sum())
            sent = missing + len(player.rtp)
            assert sent > 200  # the passage is seconds of 20 ms packets
            # Each packet is dropped with probability 0.2: the share lost lies within 4 standard deviations of it.
            assert abs(missing / sent - 0.2) < 4 * math.sqrt(0.2 * 0.8 / sent), (missing, sent)
        finally:
            await player.close()

    run(main())


async def wait_for_async_status(check: Any, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.5)
    return False
