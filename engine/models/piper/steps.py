"""What a Piper step hands the model and what it gets back: shared by the session, which plans steps, the voice,
which runs them, and the measurements at load, which time them (so none of them imports another's module for them).

A segment's first step is an ``EncodeJob`` (kind ``encode``), then ``FlowJob``s (``flow``) and ``DecodeJob``s
(``decode``), as the chunk plan (``plan.py``) orders them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtvoice.engine.models.base import SpokenTiming, Step, StepPayload
from rtvoice.engine.models.piper.plan import DecodeChunk, FlowWindow


@dataclass
class EncodeJob(StepPayload):
    """A segment through the encoder: phonemes to its frame-level prior (batchable across streams)."""

    kind = "encode"
    text: str
    rng: np.random.Generator
    length_scale: float
    noise_scale: float
    noise_w: float
    timings: bool = True
    """Work out when each token is heard (``EncodedSegment.tokens``); False for a stream that sends no words."""
    speed: float = 1.0
    """The segment's pace: its frames are 1/speed of those at ``length_scale`` (``pace.py``)."""


@dataclass
class EncodedSegment:
    frames: int
    frame_inputs: dict[str, np.ndarray]
    """Flow inputs of this segment: [C, T] arrays, scalars as they are."""
    tokens: tuple[SpokenTiming, ...] | None = None
    """When each token of the text is heard, from the encoder's durations; None when the job asked for none or the
    ids could not be traced to phonemes (a phonemiser with ids of its own)."""


@dataclass
class FlowJob(StepPayload):
    """A window of frames through the flow: prior to latent."""

    kind = FlowWindow.kind
    inputs: dict[str, np.ndarray]
    keep_from: int
    keep_frames: int


@dataclass
class DecodeJob(StepPayload):
    """A chunk of latent through the decoder: audio."""

    kind = DecodeChunk.kind
    latent: np.ndarray
    start: int
    """First latent frame in ``latent`` (left context included)."""
    end: int
    """Frame where this chunk's final audio stops; a cross-fade tail follows it."""


PiperPayload = EncodeJob | FlowJob | DecodeJob
PiperStep = Step[PiperPayload]
