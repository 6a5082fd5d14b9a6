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
"""

from __future__ import annotations

from typing import Any

from aiortc.rtp import is_rtcp

from rtvoice.app.whep.mediastreams import RTP_TIMESTAMP_MASK, SpeechTrack

RTP_HEADER_BYTES = 12
MARKER = 0x80
"""The marker bit, in the header's second byte (with the 7-bit payload type)."""
PAYLOAD_TYPE = 0x7F


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
        """The serialized packet with its marker bit (and RED's payload type) set from the track (RTCP, other SSRCs:
        unchanged)."""
        if len(data) < RTP_HEADER_BYTES or is_rtcp(data) or int.from_bytes(data[8:12], "big") != self._ssrc:
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
        await self._transport._send_rtp(self.marked(data))
