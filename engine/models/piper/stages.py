"""A Piper voice's three stages as ``graph.py`` cuts them: each stage's model and interface, and the names the voice
feeds and reads between them. Kept apart from the splitter so that a voice whose split was kept
(``prepare.py``) loads without onnx.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    """One sub-graph: its serialized model and its interface."""

    model: bytes
    inputs: list[str]
    outputs: list[str]


@dataclass(frozen=True)
class PiperGraphs:
    encoder: Stage
    flow: Stage
    decoder: Stage
    duration_noise: list[str] = field(default_factory=list)
    """Encoder inputs that replace the duration predictor's random draws."""
    prior_noise: str = ""
    """Flow input that replaces the prior's random draw."""
    prior_mean: str = ""
    """Encoder output whose shape the prior's draw takes."""
    latent: str = ""
    """The tensor between flow and decoder."""
    frame_mask: str = ""
    """The [B, 1, T] frame mask produced by the encoder."""
    durations: str = ""
    """The encoder output [B, 1, N]: frames of each phoneme id (0 for padding), speed included."""
