"""What a CosyVoice2 step hands the model and what it gets back: shared by the voices, which plan steps, and the
runner, which runs them (neither imports the other's module for them).

A segment's first ``lm`` step is a ``PrefillJob`` (the prompt through the backbone, then the first token); each
later ``lm`` step a ``NextTokenJob``; a ``token2wav`` step a ``Token2WavJob``. Both LM jobs are of kind ``lm``:
one backbone pass runs either (their batch keys keep prefills and next tokens in separate calls). Payloads carry
their stream's own state and prompt, so steps of different voices of one model share a call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rtvoice.engine.models.base import Step, StepPayload

from .llm import LMStream
from .token2wav import ChunkPlan, Token2WavStream

MIN_TOKEN_TEXT_RATIO = 2.0
MAX_TOKEN_TEXT_RATIO = 20.0
"""The LM makes between 2 and 20 speech tokens per text token (the reference's bounds)."""


@dataclass(frozen=True)
class LMPrompt:
    text_ids: torch.Tensor
    """[1, P] text ids before the segment's text (prompt text or instruction)."""
    speech_tokens: torch.Tensor
    """[1, S] speech tokens after the task id (zero-shot's prompt tokens)."""


@dataclass
class PrefillJob(StepPayload):
    kind = "lm"
    text_ids: list[int]
    """The segment's text ids; the tensor is made in the runner, not each time the scheduler asks."""
    prompt: LMPrompt
    generator: torch.Generator
    max_tokens: int
    """Cap on tokens so that prompt + speech fit the flow's fixed noise."""


@dataclass
class NextTokenJob(StepPayload):
    """One more token of a segment whose prefill is done (the LM's decode step)."""

    kind = "lm"
    stream: LMStream


@dataclass
class LMResult:
    stream: LMStream
    token: int | None
    """The new token, or None when the LM stopped (a stop token, or no text to speak)."""


@dataclass
class Token2WavJob(StepPayload):
    kind = "token2wav"
    stream: Token2WavStream
    plan: ChunkPlan
    """The chunk as planned with the step: the LM may add tokens while it runs."""


CosyVoice2Payload = PrefillJob | NextTokenJob | Token2WavJob
CosyVoice2Step = Step[CosyVoice2Payload]
