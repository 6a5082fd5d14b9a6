"""Audio made faster or slower without changing its pitch, as it streams: WSOLA (waveform-similarity overlap-add).

For voices that speak at one rate (CosyVoice2 streams at speed 1): SSML's ``prosody rate`` stretches their audio
instead. Each output frame is the input frame near its nominal place (``hop × rate`` on) that best continues the
frame before it, so periods line up and no phasing is heard; frames overlap by half under a Hann window, which sums to
one. A frame is 20 ms and the search ±5 ms: a voice's pitch period is 2.5–12 ms, so one period always fits.
"""

from __future__ import annotations

import numpy as np

HOP_S = 0.01
"""Output hop: half a 20 ms frame."""


class TimeStretch:
    """One segment's audio at ``rate`` times its speed (2.0: half as long), fed and taken in pieces."""

    def __init__(self, rate: float, sample_rate: int) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.hop = max(1, round(HOP_S * sample_rate))
        self.frame = 2 * self.hop
        self.tolerance = self.hop // 2
        self.window = np.hanning(self.frame + 1)[:-1].astype(np.float32)  # periodic: halves overlap-add to one
        self._input = np.zeros(0, dtype=np.float32)
        self._input_start = 0
        """Input samples dropped from the front of ``_input`` (no later frame reaches them)."""
        self._output = np.zeros(self.frame, dtype=np.float32)
        """Overlap-add accumulator from output sample ``_emitted`` on."""
        self._emitted = 0
        self._frames = 0
        self._previous: int | None = None
        """Where (in the input) the last frame taken starts."""
        self._fed = 0

    def process(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        """The output that is final once ``audio`` has come (all of it with ``last``)."""
        self._input = np.concatenate([self._input, audio.astype(np.float32, copy=False)])
        self._fed += len(audio)
        if last:
            # Frames until the nominal place passes the end; the zeros behind it only fill the last window.
            end_frames = int(np.ceil(self._fed / (self.hop * self.rate))) + 1
            self._input = np.concatenate([self._input, np.zeros(self.frame + 2 * self.tolerance, np.float32)])
            while self._frames < end_frames:
                self._add_frame()
            out_len = max(0, round(self._fed / self.rate) - self._emitted)
            return self._take(out_len)
        while self._can_add():
            self._add_frame()
        return self._take(self._frames * self.hop - self._emitted)

    def _nominal(self, index: int) -> int:
        return round(index * self.hop * self.rate)

    def _can_add(self) -> bool:
        """The next frame's search window and its predecessor's continuation are all in."""
        needed = self._nominal(self._frames) + self.tolerance + self.frame
        if self._previous is not None:
            needed = max(needed, self._previous + self.hop + self.frame)
        return needed <= self._input_start + len(self._input)

    def _slice(self, start: int, length: int) -> np.ndarray:
        local = start - self._input_start
        piece = self._input[max(0, local) : local + length]
        if local < 0:
            piece = np.concatenate([np.zeros(-local, np.float32), piece])
        if len(piece) < length:
            piece = np.concatenate([piece, np.zeros(length - len(piece), np.float32)])
        return piece

    def _add_frame(self) -> None:
        nominal = self._nominal(self._frames)
        if self._previous is None:
            start = nominal
        else:
            target = self._slice(self._previous + self.hop, self.frame)
            low = max(0, nominal - self.tolerance)
            region = self._slice(low, self.frame + nominal + self.tolerance - low)
            scores = np.correlate(region, target, mode="valid")
            start = low + int(np.argmax(scores)) if np.any(scores) else nominal
        frame = self._slice(start, self.frame) * self.window
        offset = self._frames * self.hop - self._emitted
        if offset + self.frame > len(self._output):
            grown = np.zeros(offset + self.frame, dtype=np.float32)
            grown[: len(self._output)] = self._output
            self._output = grown
        self._output[offset : offset + self.frame] += frame
        self._previous = start
        self._frames += 1
        self._forget()

    def _forget(self) -> None:
        """Drop input that neither the next search nor the next continuation can reach."""
        assert self._previous is not None
        keep_from = min(self._nominal(self._frames) - self.tolerance, self._previous + self.hop)
        drop = max(0, keep_from - self._input_start)
        if drop > 4 * self.frame:
            self._input = self._input[drop:]
            self._input_start += drop

    def _take(self, samples: int) -> np.ndarray:
        samples = max(0, samples)
        if samples > len(self._output):
            self._output = np.concatenate([self._output, np.zeros(samples - len(self._output), np.float32)])
        out = self._output[:samples].copy()
        self._output = self._output[samples:]
        if len(self._output) < self.frame:
            self._output = np.concatenate([self._output, np.zeros(self.frame - len(self._output), np.float32)])
        self._emitted += samples
        return out
