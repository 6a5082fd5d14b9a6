"""The RTP marker bit of the session's audio: set on the first packet of a talkspurt, clear on every other.

RFC 3551 (section 4.1) marks the first packet of a talkspurt and no other
audio packet. aiortc's RTP sender sets the bit on the last packet of every
encoded frame, which is right for video and marks every audio packet. Nor does
it let a track say which packets begin a talkspurt. ``MarkerBitTransport``
stands between one sender and its DTLS transport and sets the bit of each of
that sender's RTP packets from its ``SpeechTrack``, matched by RTP timestamp,
so retransmissions get the same bit as the original. RTCP and other SSRCs
pass through untouched.
"""

from __future__ import annotations

from typing import Any

from aiortc.rtp import is_rtcp

from rtvoice.app.whep.mediastreams import RTP_TIMESTAMP_MASK, SpeechTrack

RTP_HEADER_BYTES = 12
MARKER = 0x80
"""The marker bit, in the header's second byte (with the 7-bit payload type)."""


class MarkerBitTransport:
    """A sender's view of its DTLS transport that rewrites the marker bit of the sender's RTP packets."""

    def __init__(self, transport: Any, track: SpeechTrack, ssrc: int) -> None:
        self._transport = transport
        self._track = track
        self._ssrc = ssrc
        self._origin: int | None = None
        """The RTP timestamp of the track's first packet (pts 0): aiortc adds a random origin."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def marked(self, data: bytes) -> bytes:
        """The serialized packet with its marker bit set from the track (RTCP, other SSRCs: unchanged)."""
        if len(data) < RTP_HEADER_BYTES or is_rtcp(data) or int.from_bytes(data[8:12], "big") != self._ssrc:
            return data
        timestamp = int.from_bytes(data[4:8], "big")
        if self._origin is None:
            self._origin = timestamp
        marker = MARKER if self._track.begins_talkspurt((timestamp - self._origin) & RTP_TIMESTAMP_MASK) else 0
        return data[:1] + bytes([(data[1] & ~MARKER & 0xFF) | marker]) + data[2:]

    async def _send_rtp(self, data: bytes) -> None:
        await self._transport._send_rtp(self.marked(data))
