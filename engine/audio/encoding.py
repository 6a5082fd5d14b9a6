"""Streaming audio encoders: raw PCM (int16, float32), streaming WAV, PyAV codecs, and Opus packets for RTP.

Every encoder takes int16 mono chunks as they come and returns the bytes that
are ready, so a response body can be sent progressively.
"""

from __future__ import annotations

import fractions
import struct
from dataclasses import dataclass
from typing import Protocol

import av
import numpy as np

from rtvoice.engine.audio.pcm import to_float32

UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True)
class AudioFormat:
    name: str
    content_type: str
    container: str | None = None
    codec: str | None = None
    bit_rate: int | None = None
    sample_rates: tuple[int, ...] | None = None
    """The rates the codec takes; None: any."""


FORMATS: dict[str, AudioFormat] = {
    "pcm": AudioFormat("pcm", "audio/pcm"),
    "wav": AudioFormat("wav", "audio/wav"),
    "mp3": AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", 64_000),
    "opus": AudioFormat("opus", "audio/ogg; codecs=opus", "ogg", "libopus", 32_000, (8000, 12000, 16000, 24000, 48000)),
    "aac": AudioFormat("aac", "audio/aac", "adts", "aac", 64_000),
    "flac": AudioFormat("flac", "audio/flac", "flac", "flac"),
}


class Encoder(Protocol):
    content_type: str

    def encode(self, pcm: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


def wav_header(sample_rate: int, data_bytes: int | None = None, channels: int = 1) -> bytes:
    """A 44-byte PCM WAV header; without ``data_bytes`` the sizes say 'unknown' (0xFFFFFFFF), for streaming."""
    block_align = channels * 2
    data_size = UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff_size = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


class PcmEncoder:
    content_type = FORMATS["pcm"].content_type

    def encode(self, pcm: np.ndarray) -> bytes:
        return pcm.astype("<i2", copy=False).tobytes()

    def finish(self) -> bytes:
        return b""


class PcmF32Encoder:
    """Raw float32 little-endian samples in [-1, 1] (Cartesia's ``pcm_f32le``)."""

    content_type = FORMATS["pcm"].content_type

    def encode(self, pcm: np.ndarray) -> bytes:
        return to_float32(pcm).astype("<f4", copy=False).tobytes()

    def finish(self) -> bytes:
        return b""


class WavEncoder(PcmEncoder):
    content_type = FORMATS["wav"].content_type

    def __init__(self, sample_rate: int) -> None:
        self._header: bytes | None = wav_header(sample_rate)

    def header(self) -> bytes:
        """The header alone, so a response can start before the first audio."""
        header, self._header = self._header or b"", None
        return header

    def encode(self, pcm: np.ndarray) -> bytes:
        return self.header() + super().encode(pcm)

    def finish(self) -> bytes:
        return self.header()


class _Sink:
    """A write-only file for PyAV's muxer; what it gathers is taken after each packet."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


class AvEncoder:
    """mp3, opus (in Ogg), aac (ADTS) and flac through PyAV's codecs."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        self.content_type = fmt.content_type
        self.sample_rate = sample_rate
        self._sink = _Sink()
        # Ogg pages are otherwise a second long: flush one per 20 ms packet so audio streams.
        options = {"page_duration": "20000"} if fmt.container == "ogg" else {}
        if fmt.codec is None:
            raise ValueError(f"{fmt.name} has no PyAV codec")
        self._container = av.open(self._sink, mode="w", format=fmt.container, options=options)
        stream = self._container.add_stream(fmt.codec, rate=sample_rate)
        if not isinstance(stream, av.AudioStream):
            raise ValueError(f"{fmt.codec} is not an audio codec")
        self._stream = stream
        self._stream.layout = "mono"
        if fmt.bit_rate:
            self._stream.bit_rate = fmt.bit_rate
        self._pts = 0
        self._closed = False

    def encode(self, pcm: np.ndarray) -> bytes:
        if len(pcm) == 0:
            return self._sink.take()
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16)[None, :], format="s16", layout="mono"
        )
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += len(pcm)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        if not self._closed:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
            self._closed = True
        return self._sink.take()


SETTLE_FRAMES = 4
"""Silent frames encoded after speech before an Opus encoder's output is its steady silence packet."""
LOOKAHEAD_SAMPLES_48K = 312
"""libopus's lookahead (6.5 ms): a new encoder's first packet has zeros where the old one's last frame ended."""
QUIET_PEAK = 328
"""A frame edge whose samples stay below this (-40 dBFS) loses nothing audible to a new encoder's zeros."""
MAX_SWITCH_WAIT_FRAMES = 50
"""A retune waits at most this many frames (1 s of 20 ms frames) for a quiet edge, then switches anyway."""


@dataclass(frozen=True)
class OpusTuning:
    """What libopus takes only when an encoder is opened (PyAV sets no encoder control later)."""

    bit_rate: int
    packet_loss_percent: int = 0
    """The loss the encoder expects (``packet_loss``): libopus spends more on in-band FEC, and leans less on
    earlier frames, the higher it is."""
    fec: bool = False
    """In-band FEC (``fec``): each packet carries a coarse copy of the frame before it (SILK's LBRR)."""

    def codec_options(self) -> dict[str, str]:
        options = {"application": "voip", "packet_loss": str(self.packet_loss_percent)}
        if self.fec:
            options["fec"] = "1"
        return options


class OpusPacketEncoder:
    """Fixed-size int16 mono frames to raw Opus packets (one per frame, no container), for RTP.

    Silence settles to one identical packet a few frames after speech ends, so from then on that
    packet is reused instead of encoding: a listener between utterances costs no codec work.

    ``retune`` changes bit rate, loss hint and FEC: libopus takes them at open time only (PyAV sets
    no encoder control later), so a new encoder takes over, one packet per frame as before. Its first
    packet is coded on its own (libopus's first frame does not lean on earlier ones, so the player's
    decoder, which holds the old encoder's frames, decodes it right; an encoder fed the old frames first
    would code against frames the player never got). It starts from zeros, though, where the old
    encoder's last ``LOOKAHEAD_SAMPLES_48K`` samples were still to come: so the switch waits for silence,
    or a frame edge quiet on both sides, for up to ``MAX_SWITCH_WAIT_FRAMES``.
    """

    def __init__(self, sample_rate: int, frame_samples: int, tuning: OpusTuning) -> None:
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples
        self.tuning = tuning
        self._pending: OpusTuning | None = None
        self._time_base = fractions.Fraction(1, sample_rate)
        self.encoded = 0
        self.switches = 0
        """Encoders that took over from an earlier one (``retune``)."""
        self._waited = 0
        self._last: np.ndarray | None = None
        self._lookahead = LOOKAHEAD_SAMPLES_48K * sample_rate // 48_000
        self._zeros = np.zeros(frame_samples, dtype=np.int16)
        self._codec = self._open(self.tuning)
        self._silent_run = SETTLE_FRAMES  # a fresh encoder reaches the steady packet as fast as after speech
        self._silence = self._steady_silence()

    def _open(self, tuning: OpusTuning) -> av.AudioCodecContext:
        codec = av.CodecContext.create("libopus", "w")
        assert isinstance(codec, av.AudioCodecContext)
        codec.bit_rate = tuning.bit_rate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = self.sample_rate
        codec.time_base = self._time_base
        codec.options = tuning.codec_options()
        return codec

    def _encode(self, pcm: np.ndarray) -> bytes:
        self.encoded += 1
        self._last = pcm
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.time_base = self._time_base
        return b"".join(bytes(p) for p in self._codec.encode(frame))

    def _steady_silence(self) -> bytes:
        packet = b""
        for _ in range(SETTLE_FRAMES + 2):
            packet = self._encode(self._zeros)
        return packet

    @property
    def next_tuning(self) -> OpusTuning:
        """The tuning of the next packet."""
        return self._pending or self.tuning

    def retune(self, tuning: OpusTuning) -> None:
        """Encode with ``tuning`` from the next frame on (a new encoder takes over then)."""
        self._pending = None if tuning == self.tuning else tuning

    def _quiet_edge(self, pcm: np.ndarray | None) -> bool:
        """Whether the old encoder's unsent tail and this frame's head are (near) silent."""
        edges = [] if self._last is None else [self._last[-self._lookahead :]]
        if pcm is not None:
            edges.append(pcm[: self._lookahead])
        return all(int(np.abs(e.astype(np.int32)).max(initial=0)) < QUIET_PEAK for e in edges)

    def _switch(self, tuning: OpusTuning) -> None:
        self._codec = self._open(tuning)
        self.tuning = tuning
        self.switches += 1
        self._waited = 0
        settled = self._silent_run >= SETTLE_FRAMES
        self._silence = self._steady_silence()
        if not settled:  # the steady silence was made on the new encoder: start it afresh for what follows
            self._codec = self._open(tuning)

    def encode(self, pcm: np.ndarray | None) -> bytes:
        """One frame's packet; None is a frame of silence."""
        if self._pending is not None:
            if self._quiet_edge(pcm) or self._waited >= MAX_SWITCH_WAIT_FRAMES:
                self._switch(self._pending)
                self._pending = None
            else:
                self._waited += 1
        if pcm is not None:
            self._silent_run = 0
            return self._encode(pcm)
        if self._silent_run >= SETTLE_FRAMES:
            return self._silence
        self._silent_run += 1
        return self._encode(self._zeros)


def create_encoder(format_name: str, sample_rate: int) -> Encoder:
    fmt = FORMATS[format_name]
    if fmt.name == "pcm":
        return PcmEncoder()
    if fmt.name == "wav":
        return WavEncoder(sample_rate)
    return AvEncoder(fmt, sample_rate)
