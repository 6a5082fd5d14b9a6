"""The RTP marker bit of the session's audio: set on the first packet of a talkspurt, clear on every other.

RFC 3551 (section 4.1) marks the first packet of a talkspurt and no other
audio packet. aiortc's RTP sender sets the bit on the last packet of every
encoded frame, which is right for video and marks every audio packet. Nor does
it let a track say which packets begin a talkspurt. ``MarkerBitTransport``
stands between one sender and its DTLS transport and sets the bit of each of
that sender's RTP packets from its ``SpeechTrack``, matched by RTP timestamp,
so retransmissions get the same bit as the original. RTCP and other SSRCs
pass through untouched.

The same byte holds the payload type: aiortc sends every packet with the
first negotiated codec's, Opus, and a packet the track wrapped in RED (RFC 2198)
gets RED's here, also matched by timestamp.

It is also where a test or benchmark makes the path lossy (``RTVOICE_WHEP_SEND_LOSS``,
``SendLoss``): a share of the sender's new RTP packets never reaches the DTLS
transport, so the player sees real sequence gaps and reports them, as on a
lossy link. Never set in production.
"""

from __future__ import annotations

import random
from typing import Any

from aiortc.rtp import is_rtcp

from rtvoice.app.whep.mediastreams import RTP_TIMESTAMP_MASK, SpeechTrack

RTP_HEADER_BYTES = 12
MARKER = 0x80
"""The marker bit, in the header's second byte (with the 7-bit payload type)."""
PAYLOAD_TYPE = 0x7F


class SendLoss:
    """TEST AND BENCHMARK HOOK (``RTVOICE_WHEP_SEND_LOSS``): which of a sender's RTP packets to drop, each new one
    with probability ``rate``, from a generator seeded by ``seed`` (the session's id). A sequence number at or behind
    the newest seen is a retransmission and always goes."""

    def __init__(self, rate: float, seed: str) -> None:
        self.rate = rate
        self._random = random.Random(seed)
        self._newest: int | None = None
        self.dropped = 0

    def drops(self, sequence_number: int) -> bool:
        if self._newest is not None and not 0 < (sequence_number - self._newest) & 0xFFFF < 0x8000:
            return False
        self._newest = sequence_number
        if self._random.random() >= self.rate:
            return False
        self.dropped += 1
        return True


class MarkerBitTransport:
    """A sender's view of its DTLS transport that rewrites the marker bit of the sender's RTP packets (and, as a test
    hook, drops some of them: ``loss``)."""

    def __init__(self, transport: Any, track: SpeechTrack, ssrc: int, loss: SendLoss | None = None) -> None:
        self._transport = transport
        self._track = track
        self._ssrc = ssrc
        self._loss = loss
        self._origin: int | None = None
        """The RTP timestamp of the track's first packet (pts 0): aiortc adds a random origin."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _own(self, data: bytes) -> bool:
        """Whether ``data`` is an RTP packet of this sender (not RTCP, not another SSRC)."""
        return len(data) >= RTP_HEADER_BYTES and not is_rtcp(data) and int.from_bytes(data[8:12], "big") == self._ssrc

    def marked(self, data: bytes) -> bytes:
        """The serialized packet with its marker bit (and RED's payload type) set from the track (RTCP, other SSRCs:
        unchanged)."""
        if not self._own(data):
            return data
        timestamp = int.from_bytes(data[4:8], "big")
        if self._origin is None:
            self._origin = timestamp
        pts = (timestamp - self._origin) & RTP_TIMESTAMP_MASK
        marker = MARKER if self._track.begins_talkspurt(pts) else 0
        payload_type = self._track.payload_type_of(pts)
        if payload_type is None:
            payload_type = data[1] & PAYLOAD_TYPE
        return data[:1] + bytes([marker | payload_type]) + data[2:]

    async def _send_rtp(self, data: bytes) -> None:
        if self._loss is not None and self._own(data) and self._loss.drops(int.from_bytes(data[2:4], "big")):
            return
        await self._transport._send_rtp(self.marked(data))
