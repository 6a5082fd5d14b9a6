"""The WHEP session's audio track and its RTP marker bits, on an injected clock: pacing, stalls, talkspurts.

No test here sleeps: the track takes its clock and its sleep from the test, and a
stall of the event loop is the fake clock moving on while the track waits.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Coroutine
from itertools import pairwise
from typing import Any

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtcpByePacket, RtcpPacket, RtpPacket

from rtvoice.app.whep.marker import MarkerBitTransport
from rtvoice.app.whep.mediastreams import FRAME_S, FRAME_SAMPLES, LATE_S, SAMPLE_RATE, SpeechTrack
from rtvoice.engine.audio.encoding import SETTLE_FRAMES

TONE = (np.sin(np.arange(FRAME_SAMPLES) * 2 * np.pi * 440 / SAMPLE_RATE) * 8000).astype(np.int16)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


class FakeTime:
    """The track's clock and sleep. ``stall`` makes the next sleep overrun: the event loop was busy."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0
        self._stalls: deque[float] = deque()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept += seconds
        self.now += seconds + (self._stalls.popleft() if self._stalls else 0.0)

    def stall(self, seconds: float) -> None:
        self._stalls.append(seconds)


def make_track() -> tuple[SpeechTrack, FakeTime]:
    fake = FakeTime()
    return SpeechTrack(clock=fake.clock, sleep=fake.sleep), fake


def count_late(track: SpeechTrack) -> list[int]:
    """The late frames the track reports (what the session counts into its metric)."""
    late: list[int] = []
    track.on_late = late.append
    return late


def skipped_frames(pts: list[int]) -> int:
    """Frames of RTP time passed over between consecutive packets (each packet advances one frame)."""
    return sum((b - a) // FRAME_SAMPLES - 1 for a, b in pairwise(pts))


async def pull(track: SpeechTrack, fake: FakeTime, count: int) -> list[tuple[float, int, bool]]:
    """``count`` packets as (time sent, pts, begins a talkspurt)."""
    sent = []
    for _ in range(count):
        packet = await track.recv()
        sent.append((fake.now, packet.pts, track.begins_talkspurt(packet.pts)))
    return sent


def test_no_media_before_the_first_text_then_one_packet_per_frame_time() -> None:
    async def main() -> None:
        track, fake = make_track()
        late = count_late(track)
        waiting = asyncio.ensure_future(track.recv())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # connected, nothing said yet: no packet at all
        track.activate()
        first = await waiting
        start = fake.now
        assert first.pts == 0 and track.begins_talkspurt(0)
        sent = await pull(track, fake, 49)
        assert [pts for _, pts, _ in sent] == [i * FRAME_SAMPLES for i in range(1, 50)]
        assert [t - start for t, _, _ in sent] == pytest.approx([i * FRAME_S for i in range(1, 50)])
        assert fake.slept == pytest.approx(49 * FRAME_S)  # each packet waited for its time: none early
        assert not any(marked for _, _, marked in sent)  # one talkspurt: the stream's first packet
        assert skipped_frames([first.pts] + [pts for _, pts, _ in sent]) == 0 and late == []
        track.stop()

    run(main())


def test_a_stall_skips_rtp_time_instead_of_bursting() -> None:
    async def main() -> None:
        track, fake = make_track()
        late = count_late(track)
        track.activate()
        before = await pull(track, fake, 5)
        start = fake.now - 4 * FRAME_S
        fake.stall(0.150)  # the loop is busy past the next frame's due time
        after = await pull(track, fake, 10)
        t0, pts0, marked0 = after[0]
        # Woken 150 ms late: the packet takes the timestamp of now, 7 frames of RTP time are skipped, none sent late.
        assert pts0 == (5 + 7) * FRAME_SAMPLES and marked0
        assert skipped_frames([before[-1][1], pts0]) == 7 and late == [1]
        lag = t0 - (start + pts0 / SAMPLE_RATE)
        assert lag == pytest.approx(0.010)
        # Then paced again on the same 20 ms grid, no catching up.
        assert [b[0] - a[0] for a, b in pairwise(after)] == pytest.approx([FRAME_S - lag] + [FRAME_S] * 8)
        assert [b[1] - a[1] for a, b in pairwise(after)] == [FRAME_SAMPLES] * 9
        assert not any(marked for _, _, marked in after[1:])
        # A pull that comes late between recv() calls (the sender itself was held up) is treated the same way.
        fake.now += 0.055
        t, pts, marked = (await pull(track, fake, 1))[0]
        assert marked and skipped_frames([after[-1][1], pts]) == 1 and late == [1]  # 35 ms behind: not "late"
        assert 0 <= t - (start + pts / SAMPLE_RATE) < FRAME_S
        track.stop()

    run(main())


def test_never_faster_than_real_time_whatever_the_stalls() -> None:
    """Every packet leaves within one frame after its timestamp's time, and never before it."""

    async def main() -> None:
        generator = random.Random(7)
        track, fake = make_track()
        late = count_late(track)
        track.activate()
        first = await track.recv()
        start = fake.now
        last_pts = first.pts
        sent_pts = [first.pts]
        times = [fake.now]
        was_speech = False
        for _ in range(400):
            if generator.random() < 0.2:
                fake.stall(generator.choice([0.004, 0.019, 0.021, 0.045, 0.120, 0.6]))
            if generator.random() < 0.05:
                fake.now += generator.uniform(0, 0.1)
            if generator.random() < 0.3:
                track.push(TONE)
            spoken = track.speech_frames_sent
            packet = await track.recv()
            is_speech = track.speech_frames_sent > spoken
            lag = fake.now - (start + packet.pts / SAMPLE_RATE)
            assert 0 <= lag < FRAME_S + 1e-9
            step = packet.pts - last_pts
            assert step >= FRAME_SAMPLES and step % FRAME_SAMPLES == 0
            # Marked: the first packet after RTP time was skipped, and speech after silence.
            assert track.begins_talkspurt(packet.pts) == (step > FRAME_SAMPLES or (is_speech and not was_speech))
            last_pts, was_speech = packet.pts, is_speech
            sent_pts.append(packet.pts)
            times.append(fake.now)
        assert skipped_frames(sent_pts) > 0 and late
        # Over any stretch, at most one packet more than its duration in frames (the lag bound above).
        for i in range(len(times)):
            for j in range(i + 1, min(len(times), i + 60)):
                assert j - i <= (times[j] - times[i]) / FRAME_S + 1 + 1e-6
        track.stop()

    run(main())


def test_talkspurts_begin_with_speech_after_silence() -> None:
    async def main() -> None:
        track, fake = make_track()
        track.activate()
        silence = await pull(track, fake, 3)  # the first text's synthesis: silence primes the player
        for _ in range(3):
            track.push(TONE)
        speech = await pull(track, fake, 3)
        gap = await pull(track, fake, 4)
        track.push(TONE)
        again = await pull(track, fake, 2)
        assert [m for _, _, m in silence] == [True, False, False]
        assert [m for _, _, m in speech] == [True, False, False]  # speech after silence: a talkspurt
        assert [m for _, _, m in gap] == [False] * 4  # silence after speech is not one
        assert [m for _, _, m in again] == [True, False]
        assert track.speech_frames_sent == 4
        track.stop()

    run(main())


def test_frames_marks_and_settled_silence() -> None:
    async def main() -> None:
        track, fake = make_track()
        track.activate()
        decoder = av.CodecContext.create("libopus", "r")
        seen: list[str] = []
        tone_frames = 3
        track.mark(lambda: seen.append("start"))
        for _ in range(tone_frames):
            track.push(TONE)
        track.mark(lambda: seen.append("end"))
        # The tone, then enough silence for the encoder to settle, and a few packets more.
        packets = [await track.recv() for _ in range(tone_frames + SETTLE_FRAMES + 4)]
        assert seen == ["start", "end"]
        levels = []
        for packet in packets:
            frames = decoder.decode(packet)
            levels.append(max((float(np.abs(f.to_ndarray()).max()) for f in frames), default=0.0))
        assert min(levels[1:tone_frames]) > 2000  # the tone
        assert max(levels[-4:]) < 50  # then silence
        # Once silence has settled the encoder is not called any more: a listening session costs no codec work.
        encoded = track._encoder.encoded
        await track.recv()
        assert track._encoder.encoded == encoded
        track.push(TONE)
        track.clear()
        assert track.speech_frames_sent == tone_frames
        await track.recv()
        assert track.speech_frames_sent == tone_frames  # cleared: silence from the next frame on
        track.stop()
        with pytest.raises(MediaStreamError):
            await track.recv()

    run(main())


def test_stop_before_the_first_text_ends_a_waiting_recv() -> None:
    async def main() -> None:
        track, _ = make_track()
        waiting = asyncio.ensure_future(track.recv())
        await asyncio.sleep(0)
        track.stop()
        with pytest.raises(MediaStreamError):
            await waiting

    run(main())


def test_late_frames_are_counted_past_the_threshold() -> None:
    async def main() -> None:
        track, fake = make_track()
        late = count_late(track)
        track.activate()
        await pull(track, fake, 2)
        fake.stall(LATE_S + 0.001)
        await pull(track, fake, 1)
        assert late == [1]
        track.stop()

    run(main())


# -- the marker bit on the wire --------------------------------------------------------------------------


class RecordingTransport:
    """Stands in for aiortc's DTLS transport: keeps what the sender sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._stats_id = "transport_1"

    async def _send_rtp(self, data: bytes) -> None:
        self.sent.append(data)


def rtp(ssrc: int, origin: int, pts: int, sequence: int) -> bytes:
    """A packet as aiortc's sender serializes it: the marker set, the timestamp offset by a random origin."""
    packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=(origin + pts) & 0xFFFFFFFF, marker=1)
    packet.ssrc = ssrc
    packet.payload = b"\xfc\x01\x02"
    return packet.serialize()


def test_marker_bit_follows_the_track() -> None:
    async def main() -> None:
        track, fake = make_track()
        track.activate()
        recording = RecordingTransport()
        transport = MarkerBitTransport(recording, track, ssrc=1234)
        assert transport._stats_id == "transport_1"  # everything else is the DTLS transport's
        origin = 0xFFFFFF00  # wraps past 2**32 within the test
        pts = [packet.pts for packet in [await track.recv() for _ in range(3)]]
        track.push(TONE)
        track.push(TONE)
        pts += [packet.pts for packet in [await track.recv() for _ in range(3)]]
        for sequence, value in enumerate(pts):
            await transport._send_rtp(rtp(1234, origin, value, sequence))
        markers = [RtpPacket.parse(data).marker for data in recording.sent]
        assert markers == [1, 0, 0, 1, 0, 0]
        parsed = [RtpPacket.parse(data) for data in recording.sent]
        assert [p.timestamp for p in parsed] == [(origin + v) & 0xFFFFFFFF for v in pts]  # nothing else changed
        assert all(p.payload == b"\xfc\x01\x02" and p.payload_type == 111 for p in parsed)
        # A retransmission of the talkspurt's first packet is marked like the original.
        await transport._send_rtp(rtp(1234, origin, pts[3], 3))
        assert RtpPacket.parse(recording.sent[-1]).marker == 1
        # RTCP and other SSRCs pass untouched.
        bye = bytes(RtcpByePacket(sources=[1234]))
        await transport._send_rtp(bye)
        assert recording.sent[-1] == bye and isinstance(RtcpPacket.parse(bye)[0], RtcpByePacket)
        other = rtp(999, origin, pts[1], 9)
        await transport._send_rtp(other)
        assert recording.sent[-1] == other
        track.stop()

    run(main())
