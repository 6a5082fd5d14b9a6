"""libopus's decoder through ctypes, for what PyAV's decoder does not expose: in-band FEC recovery.

A player that loses packet n and holds packet n+1 can decode n+1's LBRR data
(``opus_decode(..., decode_fec=1)``) in place of n. PyAV's Opus decoder has no
such call, so this binds the few libopus functions a playout needs. The library
is the one PyAV's wheel bundles (``av.libs/libopus-*.so*``, libopus 1.5 or
later, which has ``opus_packet_has_lbrr``), else the system's ``libopus0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

import av
import numpy as np

MAX_FRAME_SAMPLES = 5760
"""120 ms at 48 kHz: the longest frame an Opus packet holds."""


class OpusError(RuntimeError):
    pass


@functools.cache
def libopus() -> ctypes.CDLL:
    """The libopus shared library, with the prototypes used here."""
    bundled = sorted((Path(av.__file__).resolve().parent.parent / "av.libs").glob("libopus*.so*"))
    path = str(bundled[0]) if bundled else ctypes.util.find_library("opus")
    if path is None:
        raise OpusError("no libopus: install PyAV's wheel (it bundles one) or Debian's libopus0")
    lib = ctypes.CDLL(path)
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_strerror.restype = ctypes.c_char_p
    lib.opus_get_version_string.restype = ctypes.c_char_p
    if hasattr(lib, "opus_packet_has_lbrr"):
        lib.opus_packet_has_lbrr.restype = ctypes.c_int
        lib.opus_packet_has_lbrr.argtypes = [ctypes.c_char_p, ctypes.c_int32]
    return lib


def version() -> str:
    return str(libopus().opus_get_version_string().decode())


def has_lbrr(packet: bytes) -> bool:
    """Whether the packet carries in-band FEC (LBRR) data for the frame before it."""
    lib = libopus()
    if not hasattr(lib, "opus_packet_has_lbrr"):
        raise OpusError(f"{version()} has no opus_packet_has_lbrr (libopus 1.5 or later does)")
    result = int(lib.opus_packet_has_lbrr(packet, len(packet)))
    if result < 0:
        raise OpusError(f"opus_packet_has_lbrr: {lib.opus_strerror(result).decode()}")
    return result == 1


class OpusDecoder:
    """A mono libopus decoder: packets, lost frames concealed (PLC) or recovered from the next packet's FEC."""

    def __init__(self, sample_rate: int = 48_000) -> None:
        self._lib = libopus()
        error = ctypes.c_int(0)
        self._state = self._lib.opus_decoder_create(sample_rate, 1, ctypes.byref(error))
        if error.value != 0 or not self._state:
            raise OpusError(f"opus_decoder_create: {self._lib.opus_strerror(error.value).decode()}")
        self._out = (ctypes.c_int16 * MAX_FRAME_SAMPLES)()

    def _decode(self, packet: bytes | None, frame_samples: int, fec: bool) -> np.ndarray:
        size = MAX_FRAME_SAMPLES if packet is not None and not fec else frame_samples
        count = self._lib.opus_decode(self._state, packet, len(packet or b""), self._out, size, int(fec))
        if count < 0:
            raise OpusError(f"opus_decode: {self._lib.opus_strerror(count).decode()}")
        return np.ctypeslib.as_array(self._out)[:count].copy()

    def decode(self, packet: bytes) -> np.ndarray:
        """The packet's samples (int16)."""
        return self._decode(packet, MAX_FRAME_SAMPLES, fec=False)

    def conceal(self, frame_samples: int) -> np.ndarray:
        """Packet loss concealment for one lost frame."""
        return self._decode(None, frame_samples, fec=False)

    def recover(self, next_packet: bytes, frame_samples: int) -> np.ndarray:
        """The lost frame before ``next_packet``, from its FEC data (libopus conceals where it has none)."""
        return self._decode(next_packet, frame_samples, fec=True)

    def close(self) -> None:
        if self._state:
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
