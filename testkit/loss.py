"""Packet loss for a captured Opus RTP stream, and a player's playout of what is left.

Loss patterns are seeded: independent random loss, and bursts from a two-state
Gilbert–Elliott model (a good state that loses nothing, a bad one that loses
most packets). ``playout`` decodes the packets as a player with a jitter buffer
one packet deep would: a lost packet is taken from the next packet's RED block
(RFC 2198) where there is one, else recovered from the next packet's in-band FEC
(``testkit/opus.py``; that packet as sent, or as RED's copy in the one after, so
RED and FEC together cover two lost packets in a row), else concealed. ``red_blocks`` reads RED payloads
independently of the server's packer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testkit.opus import OpusDecoder, has_lbrr

FRAME_SAMPLES = 960
SPEECH_FRAME_RMS = 0.01
"""A lossless frame louder than this is speech: losing it is audible."""


@dataclass(frozen=True)
class StreamPacket:
    timestamp: int
    payload_type: int
    payload: bytes


def random_losses(count: int, rate: float, seed: int) -> np.ndarray:
    """Each packet lost with probability ``rate``, independently."""
    return np.random.default_rng(seed).random(count) < rate


def gilbert_elliott(count: int, rate: float, mean_burst: float, seed: int, loss_in_bad: float = 0.9) -> np.ndarray:
    """Bursty loss averaging ``rate``: a good state without loss and a bad one losing ``loss_in_bad`` of its
    packets, left after ``mean_burst`` packets on average."""
    rng = np.random.default_rng(seed)
    bad_to_good = 1.0 / mean_burst
    bad_share = rate / loss_in_bad  # the stationary share of packets sent in the bad state
    good_to_bad = bad_to_good * bad_share / (1.0 - bad_share)
    lost = np.zeros(count, dtype=bool)
    bad = False
    draws = rng.random((count, 2))
    for i in range(count):
        bad = draws[i, 0] >= bad_to_good if bad else draws[i, 0] < good_to_bad
        lost[i] = bad and draws[i, 1] < loss_in_bad
    return lost


def red_blocks(payload: bytes) -> tuple[int, bytes, list[tuple[int, int, bytes]]]:
    """An RFC 2198 payload as (primary's payload type, primary, [(payload type, timestamp offset, data)])."""
    headers: list[tuple[int, int, int]] = []
    at = 0
    while payload[at] & 0x80:
        word = int.from_bytes(payload[at + 1 : at + 4], "big")
        headers.append((payload[at] & 0x7F, word >> 10, word & 0x3FF))
        at += 4
    primary_type = payload[at] & 0x7F
    at += 1
    blocks = []
    for block_type, offset, length in headers:
        blocks.append((block_type, offset, payload[at : at + length]))
        at += length
    return primary_type, payload[at:], blocks


@dataclass
class Playout:
    pcm: np.ndarray
    concealed_speech_samples: int
    """Samples concealed (neither decoded nor recovered) in frames that are speech in the lossless decode."""
    recovered_fec: int
    """Lost frames decoded from the next packet's in-band FEC."""
    recovered_red: int
    """Lost frames decoded from the next packet's RED block."""


def opus_of(packet: StreamPacket, red_type: int | None) -> bytes:
    if red_type is not None and packet.payload_type == red_type:
        return red_blocks(packet.payload)[1]
    return packet.payload


def redundant_copy(packets: list[StreamPacket], lost: np.ndarray, i: int, red_type: int | None) -> bytes | None:
    """Packet ``i``'s Opus packet from the RED block of packet ``i + 1``, where that arrived and carries it."""
    if red_type is None or i + 1 >= len(packets) or lost[i + 1] or packets[i + 1].payload_type != red_type:
        return None
    offset = (packets[i + 1].timestamp - packets[i].timestamp) & 0xFFFFFFFF
    return next((data for _, o, data in red_blocks(packets[i + 1].payload)[2] if o == offset), None)


def opus_following(packets: list[StreamPacket], lost: np.ndarray, i: int, red_type: int | None) -> bytes | None:
    """The Opus packet after ``i``, whose FEC may hold frame ``i``: as sent, or its RED copy in the one after."""
    if i + 1 >= len(packets):
        return None
    if not lost[i + 1]:
        return opus_of(packets[i + 1], red_type)
    return redundant_copy(packets, lost, i + 1, red_type)


def playout(
    packets: list[StreamPacket],
    lost: np.ndarray,
    fec: bool,
    red_type: int | None = None,
    reference: np.ndarray | None = None,
) -> Playout:
    """Decode ``packets`` with ``lost`` ones missing; ``reference`` (the lossless playout's pcm) tells speech
    frames from silence for the concealed count."""
    decoder = OpusDecoder()
    out: list[np.ndarray] = []
    concealed = by_fec = by_red = 0
    position = 0
    for i, packet in enumerate(packets):
        position += len(out[-1]) if out else 0
        if not lost[i]:
            out.append(decoder.decode(opus_of(packet, red_type)))
            continue
        copy = redundant_copy(packets, lost, i, red_type)
        following = opus_following(packets, lost, i, red_type)
        if copy is not None:
            out.append(decoder.decode(copy))
            by_red += 1
        elif fec and following is not None and has_lbrr(following):
            out.append(decoder.recover(following, FRAME_SAMPLES))
            by_fec += 1
        else:
            frame = decoder.conceal(FRAME_SAMPLES)
            out.append(frame)
            if reference is None or is_speech(reference[position : position + len(frame)]):
                concealed += len(frame)
    decoder.close()
    return Playout(np.concatenate(out) if out else np.zeros(0, np.int16), concealed, by_fec, by_red)


def is_speech(frame: np.ndarray) -> bool:
    if len(frame) == 0:
        return False
    level = frame.astype(np.float64) / 32768.0
    return float(np.sqrt(np.mean(level * level))) > SPEECH_FRAME_RMS


def lossless(packets: list[StreamPacket], red_type: int | None = None) -> np.ndarray:
    return playout(packets, np.zeros(len(packets), dtype=bool), fec=False, red_type=red_type).pcm
