"""Fixed-size frames from int16 chunks of any size (20 ms RTP audio frames, for one)."""

from __future__ import annotations

import numpy as np


class FrameBuffer:
    """Buffers int16 samples and hands them out in frames of exactly ``frame_samples``."""

    def __init__(self, frame_samples: int) -> None:
        if frame_samples <= 0:
            raise ValueError("frame_samples must be positive")
        self.frame_samples = frame_samples
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        """Add samples; return every frame now complete, in order."""
        pcm = np.asarray(pcm, dtype=np.int16).reshape(-1)
        data = np.concatenate((self._pending, pcm)) if len(self._pending) else pcm
        whole = len(data) - len(data) % self.frame_samples
        frames = [data[i : i + self.frame_samples].copy() for i in range(0, whole, self.frame_samples)]
        self._pending = data[whole:].copy()
        return frames

    def flush(self) -> np.ndarray | None:
        """The held-back samples padded with silence to a whole frame, or None when nothing is held."""
        if not len(self._pending):
            return None
        frame = np.zeros(self.frame_samples, dtype=np.int16)
        frame[: len(self._pending)] = self._pending
        self._pending = np.zeros(0, dtype=np.int16)
        return frame

    def clear(self) -> None:
        """Drop the held-back samples."""
        self._pending = np.zeros(0, dtype=np.int16)
