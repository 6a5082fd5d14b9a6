"""The session's audio track: 20 ms Opus packets at 48 kHz, paced to the wall clock, silence when nothing is said.

aiortc's RTP sender pulls ``recv()`` in a loop. Each call waits until its frame
is due, then returns the next queued speech frame, or silence. Marks queued
between frames run when playback reaches them: that is how the playback queue learns
when an utterance's first and last frames actually leave.

Media starts with the session's first text (``activate``), not when the
connection comes up: a player buffers whatever arrives before its playback
starts, and Chromium then plays speech only after that backlog of silence
(speeding playback up to drain it). From the first text on the track sends
without a break, silence between utterances: no DTX, which players do not
offer (``usedtx``, RFC 7587) and a JSEP answerer uses only when offered. The
silence sent while the first utterance is synthesised primes the player's
jitter buffer.

Pacing never sends audio faster than real time. A packet's RTP timestamp is
the time it is due on a 20 ms grid that starts with the first packet; a pull
that comes a whole frame or more after its due time (the event loop was
busy) moves the timestamp on by the frames missed instead of sending them late
in a burst. A player's jitter buffer then sees every packet arrive within one
frame of its timestamp: the stall costs a gap the player conceals, never a
deeper buffer that later speech would wait behind. The packets that begin a
talkspurt (the stream's first, an utterance's first frame after silence, the
first after such a gap) are remembered by timestamp for the RTP marker bit
(``app/whep/marker.py``).

The track encodes Opus itself (mono, one packet per 20 ms frame) and hands the
sender packets, which it only packetises. Silence settles to one identical
packet a few frames after speech ends, so from then on that packet is reused
instead of encoding: a listening session between utterances costs no codec
work, and none of the per-frame thread hop and level metering aiortc spends on
raw frames.

Loss protection is per session (``app/whep/adaptation.py`` picks it from the
player's receiver reports): ``tune`` sets the Opus bit rate and loss hint, with
in-band FEC where the player offered ``useinbandfec=1`` (a new encoder takes
over at the next packet, ``engine/audio/encoding.py``), and RFC 2198 redundancy
where it offered RED: each packet then also carries the one before it, and is
sent with RED's payload type (set by ``app/whep/marker.py``, like the marker bit).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import Packet

from rtvoice.app.whep.red import red_payload
from rtvoice.engine.audio.encoding import OpusPacketEncoder, OpusTuning

log = logging.getLogger(__name__)

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
"""20 ms at 48 kHz: one Opus frame, one RTP packet."""
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
OPUS_BITRATE = 40_000
"""Mono speech; fullband at this rate is transparent for a TTS voice (a clean link's rate; see adaptation.py)."""
LATE_S = 0.06
"""A frame pulled this long after it was due counts as late."""
RTP_TIMESTAMP_MASK = 0xFFFFFFFF
TALKSPURT_HISTORY = 128
"""Talkspurt starts remembered for the marker bit: as many packets as aiortc keeps for retransmission."""


class Mark:
    """A callback that runs when playback reaches its place between frames."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback


class SpeechTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        super().__init__()
        self._clock = clock
        self._sleep = sleep
        self._items: deque[np.ndarray | Mark] = deque()
        self._queued_frames = 0
        self._space = asyncio.Event()
        self._space.set()
        self._low_water = 0
        self._active = asyncio.Event()
        self._start: float | None = None
        self._timestamp = 0
        self._speaking = False
        self._talkspurts: deque[int] = deque(maxlen=TALKSPURT_HISTORY)
        self._encoder = OpusPacketEncoder(SAMPLE_RATE, FRAME_SAMPLES, OpusTuning(OPUS_BITRATE))
        self.fec = False
        """The player decodes in-band FEC (it offered ``useinbandfec=1``)."""
        self.red_payload_types: tuple[int, int] | None = None
        """(RED's, Opus's) payload types where the player offered RED; None otherwise."""
        self.red_active = False
        self._previous: tuple[bytes, int] | None = None
        """The last Opus packet sent and its timestamp: the redundant block of the next RED packet."""
        self._red_sent: deque[int] = deque(maxlen=TALKSPURT_HISTORY)
        self.speech_frames_sent = 0
        self.expecting = False
        """Set by the playback queue while an utterance is under way: an empty queue then is an underrun."""
        self.on_late: Callable[[int], None] | None = None
        self.on_underrun: Callable[[], None] | None = None

    # -- producer side ----------------------------------------------------------------------------

    def push(self, frame: np.ndarray) -> None:
        """Queue one frame of FRAME_SAMPLES int16 samples."""
        if len(frame) != FRAME_SAMPLES:
            raise ValueError(f"a frame holds {FRAME_SAMPLES} samples, not {len(frame)}")
        self._items.append(frame)
        self._queued_frames += 1

    def activate(self) -> None:
        """Start the media: the first packet leaves at once (silence until speech is queued), then every 20 ms."""
        self._active.set()

    def mark(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the frames queued so far have been sent."""
        self._items.append(Mark(callback))

    def clear(self) -> None:
        """Drop every queued frame and mark: what follows is silence, from the next frame on."""
        self._items.clear()
        self._queued_frames = 0
        self._space.set()

    async def wait_for_space(self, max_queued_s: float) -> None:
        """Backpressure: return once no more than ``max_queued_s`` of speech waits to be sent."""
        limit = max(1, round(max_queued_s / FRAME_S))
        while self._queued_frames > limit:
            self._low_water = limit
            self._space.clear()
            await self._space.wait()

    # -- loss protection --------------------------------------------------------------------------

    def negotiated(self, fec: bool, red_payload_types: tuple[int, int] | None) -> None:
        """What the answer allows: in-band FEC, and RED's and Opus's payload types (None: no RED)."""
        self.fec = fec
        self.red_payload_types = red_payload_types

    def tune(self, bit_rate: int, packet_loss_percent: int, red: bool) -> None:
        """Opus at ``bit_rate`` for ``packet_loss_percent`` loss (FEC where negotiated), and RED where negotiated,
        from the next packet on."""
        tuning = OpusTuning(bit_rate, packet_loss_percent, self.fec)
        if self._start is None and tuning != self._encoder.tuning:  # nothing sent yet: no switch, just this one
            self._encoder = OpusPacketEncoder(SAMPLE_RATE, FRAME_SAMPLES, tuning)
        self._encoder.retune(tuning)
        self.red_active = red and self.red_payload_types is not None

    @property
    def tuning(self) -> OpusTuning:
        """What the encoder encodes with (or will, from the next packet)."""
        return self._encoder.next_tuning

    @property
    def encoder_switches(self) -> int:
        return self._encoder.switches

    def payload_type_of(self, timestamp: int) -> int | None:
        """RED's payload type if the packet with this timestamp (``pts``, modulo 2**32) was sent as RED."""
        if self.red_payload_types is None or timestamp & RTP_TIMESTAMP_MASK not in self._red_sent:
            return None
        return self.red_payload_types[0]

    def _payload(self, opus: bytes) -> bytes:
        """The packet's payload: the Opus packet, or under RED the previous one and this one (RFC 2198)."""
        previous, self._previous = self._previous, (opus, self._timestamp)
        if not self.red_active or self.red_payload_types is None:
            return opus
        self._red_sent.append(self._timestamp & RTP_TIMESTAMP_MASK)
        if previous is None:
            return red_payload(self.red_payload_types[1], opus, None, 0)
        return red_payload(self.red_payload_types[1], opus, previous[0], self._timestamp - previous[1])

    # -- consumer side (aiortc's RTP sender) -------------------------------------------------------

    def _run_marks(self) -> None:
        while self._items:
            mark = self._items[0]
            if not isinstance(mark, Mark):
                return
            self._items.popleft()
            try:
                mark.callback()
            except Exception:  # a failing listener must not stop the media
                log.exception("track mark failed")

    def _next_pcm(self) -> np.ndarray | None:
        self._run_marks()
        if not self._items:
            return None
        frame = self._items.popleft()
        assert not isinstance(frame, Mark)  # _run_marks ran every mark before it
        self._queued_frames -= 1
        if self._queued_frames <= self._low_water:
            self._space.set()
        self._run_marks()  # an utterance's end mark runs as its last frame leaves
        return frame

    async def _next_timestamp(self) -> bool:
        """Wait until the next frame is due and set its timestamp; True when frames were skipped to get there."""
        now = self._clock()
        if self._start is None:
            self._start = now
            self._timestamp = 0
            return False
        self._timestamp += FRAME_SAMPLES
        due = self._start + self._timestamp / SAMPLE_RATE
        if due > now:
            await self._sleep(due - now)
            now = self._clock()  # the loop may have been busy past the due time while we slept
        behind = now - due
        if behind > LATE_S:
            if self.on_late:
                self.on_late(1)
        missed = int(behind / FRAME_S)
        if missed == 0:
            return False
        # Never catch up in a burst: the frames missed are skipped over in RTP time, not sent late.
        self._timestamp += missed * FRAME_SAMPLES
        return True

    def begins_talkspurt(self, timestamp: int) -> bool:
        """Whether the packet with this timestamp (``pts``, modulo 2**32) began a talkspurt: its marker bit is set."""
        return timestamp & RTP_TIMESTAMP_MASK in self._talkspurts

    async def recv(self) -> Packet:
        if self.readyState != "live":
            raise MediaStreamError
        first = self._start is None
        if first:
            await self._active.wait()
            if self.readyState != "live":
                raise MediaStreamError
        skipped = await self._next_timestamp()
        if self.readyState != "live":
            raise MediaStreamError
        pcm = self._next_pcm()
        if pcm is None:
            if self.expecting and self.on_underrun:
                self.on_underrun()
        else:
            self.speech_frames_sent += 1
        if first or skipped or (pcm is not None and not self._speaking):
            self._talkspurts.append(self._timestamp & RTP_TIMESTAMP_MASK)
        self._speaking = pcm is not None
        packet = Packet(self._payload(self._encoder.encode(pcm)))
        packet.pts = self._timestamp
        packet.time_base = TIME_BASE
        return packet

    def stop(self) -> None:
        self.clear()
        self.expecting = False
        super().stop()
        self._active.set()  # a recv() still waiting for the first text ends (MediaStreamError)
