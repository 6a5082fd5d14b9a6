"""The model-agnostic voice interface the scheduler drives.

A voice splits synthesis into steps (a Piper encoder pass, a flow window, a
decoder chunk; a CosyVoice LM step, a token-to-wave chunk). Each stream holds a
``VoiceSession`` that says which step it needs next; the scheduler gathers steps
with the same ``batch_key`` from many sessions and the runner hands them to
``Voice.run`` in one call. Sessions hold all per-request state; a voice holds
only its weights, so nothing is shared between requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    sample_rate: int
    model: str
    description: str = ""


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-request knobs a voice may honour."""

    speed: float = 1.0
    seed: int | None = None
    instructions: str | None = None


@dataclass
class Step:
    """One unit of model work for one stream."""

    kind: str
    batch_key: Hashable
    payload: Any
    session: VoiceSession = field(repr=False)


class VoiceSession(ABC):
    """One stream's model state: the segments it was given and how far it got."""

    segments_done: int = 0
    """Segments whose audio is complete (empty ones included)."""

    @abstractmethod
    def add_segment(self, text: str) -> None:
        """Queue a text segment for synthesis."""

    @abstractmethod
    def next_step(self) -> Step | None:
        """The step this session needs next, or None when it is waiting for text (or done)."""

    @abstractmethod
    def complete(self, step: Step, result: Any) -> np.ndarray | None:
        """Take a step's result; return float32 audio at the voice's rate that is now final."""

    @property
    @abstractmethod
    def idle(self) -> bool:
        """True when every queued segment has been turned into audio."""


class Voice(ABC):
    info: VoiceInfo

    @abstractmethod
    def open_session(self, options: SynthesisOptions) -> VoiceSession:
        """State for one new stream."""

    @abstractmethod
    def run(self, kind: str, payloads: list[Any]) -> list[Any]:
        """Run one batch of steps of ``kind``; called from runner threads, possibly concurrently."""

    def max_batch(self, kind: str) -> int:
        """Most steps of ``kind`` worth putting in one call (measured per model and device)."""
        return 1 << 16

    def validate(self, options: SynthesisOptions) -> None:
        """Raise ValueError when this voice cannot honour ``options``."""

    def warmup(self) -> None:
        """Run once so that the first request does not pay for lazy initialisation."""
