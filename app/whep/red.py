"""RTP payload for redundant audio (RFC 2198): each packet carries the frame before it as well as its own.

A player that loses packet n and receives n+1 decodes n's Opus packet from n+1's
redundant block: the frame comes back whole, where in-band FEC gives a coarser
copy. It doubles the audio's bit rate, so the session uses it only while its
player reports loss (``app/whep/adaptation.py``); Opus stays the primary block.
"""

from __future__ import annotations

MAX_TIMESTAMP_OFFSET = (1 << 14) - 1
MAX_BLOCK_BYTES = (1 << 10) - 1
FOLLOWS = 0x80
"""The F bit of a block header: another block header follows."""


def red_payload(payload_type: int, primary: bytes, previous: bytes | None, timestamp_offset: int) -> bytes:
    """Primary ``payload`` with ``previous`` (sent ``timestamp_offset`` RTP ticks earlier) as its redundant block.

    Distance 1: one redundant block, left out when there is none or it does not fit the block header's fields.
    """
    if previous is None or not 0 < timestamp_offset <= MAX_TIMESTAMP_OFFSET or len(previous) > MAX_BLOCK_BYTES:
        return bytes([payload_type]) + primary
    header = (timestamp_offset << 10) | len(previous)
    return bytes([FOLLOWS | payload_type]) + header.to_bytes(3, "big") + bytes([payload_type]) + previous + primary
