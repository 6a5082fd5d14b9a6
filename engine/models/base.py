"""The model-agnostic voice interface the scheduler drives.

A voice splits synthesis into steps (a Piper encoder pass, a flow window, a
decoder chunk; a CosyVoice LM step, a token-to-wave chunk). Each stream holds a
``VoiceSession`` that says which step it needs next; the scheduler gathers steps
with the same ``batch_key`` from many sessions and the runner hands their
payloads to ``Voice.run`` in one call. A payload is the voice's own typed
``StepPayload``; the scheduler reads only a step's kind, key, size and
``until_audio``. Sessions hold all per-request state; a voice holds only its
weights, so nothing is shared between requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np


@dataclass(frozen=True)
class VoiceInfo:
    id: str
    name: str
    language: str
    sample_rate: int
    model: str
    description: str = ""
    source: str = "builtin"
    """Where the voice comes from: ``builtin`` (loaded at start), ``registered`` (made from a recording and kept;
    deletable) or ``request`` (a one-off voice from a request's own prompt)."""
    prompt_text: str | None = None
    """What is said in the recording a registered voice was made from."""
    length_scale: float | None = None
    """The phoneme length the voice speaks with at speed 1, for voices whose model has one (Piper); protocols that
    speak in length scales convert with ``speed_for_length_scale``."""
    follows_instructions: bool = False
    """Whether ``SynthesisOptions.instructions`` change how it speaks (CosyVoice2's instruct2)."""
    cross_lingual: bool = False
    """Whether it speaks text of any language in its own voice (CosyVoice2)."""
    can_clone: bool = False
    """Whether its model makes new voices from a prompt recording (CosyVoice2 with its prompt front end)."""
    varies_rate: bool = True
    """Whether a segment can be spoken at its own rate (``VoiceSession.add_segment``'s ``rate``); for a voice that
    cannot, the stream stretches its audio instead (``engine/audio/stretch.py``)."""
    reads_phonemes: bool = False
    """Whether its text may hold IPA phonemes in Piper's ``[[ ]]`` syntax (SSML's ``phoneme``, lexicons)."""

    def speed_for_length_scale(self, length_scale: float) -> float:
        """The speed at which this voice speaks with phoneme length ``length_scale``; a voice without a native
        length scale takes 1 as its own."""
        return (self.length_scale or 1.0) / length_scale


MIN_SPEED = 0.25
MAX_SPEED = 4.0
"""The speaking rates (``SynthesisOptions.speed``; 2.0 is twice as fast) every transport accepts; a voice may
honour fewer (``Voice.validate``)."""


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-request knobs a voice may honour."""

    speed: float = 1.0
    seed: int | None = None
    instructions: str | None = None


class StepPayload:
    """What one step hands its voice's ``run``: each voice has its own payload type per kind of call.

    ``kind`` names the call: the steps of one batch share it, and the engine learns call costs per kind
    (``CostEstimate``, ``Step.until_audio``). Payload types that one call runs together share a kind
    (CosyVoice2's prefill and next-token jobs are both ``lm``). Subclasses set it as a class attribute."""

    kind: str


PayloadT = TypeVar("PayloadT", bound=StepPayload)


@dataclass
class Step(Generic[PayloadT]):
    """One unit of model work for one stream."""

    batch_key: Hashable
    """Steps with equal keys may share a call (the key includes the kind)."""
    payload: PayloadT
    session: VoiceSession = field(repr=False)
    size: int = 1
    """How much work the step is, in the voice's unit for its kind (frames, characters, tokens): what its
    cost grows with. The engine learns each kind's cost as a function of it."""
    until_audio: tuple[tuple[str, int], ...] = ()
    """The steps (kind, size) that must follow this one before its stream has new audio; empty when this
    step releases audio itself (or the voice does not say)."""

    @property
    def kind(self) -> str:
        return self.payload.kind


CostEstimate = Callable[[str, int], float]
"""Estimated seconds of one call of a step kind and size, as measured on this machine (0 when unknown). One that is
hashable answers the same for as long as it is equal to itself (``CostModel.estimator``: until the next measured
call), so what a voice works out from it alone may be kept under it."""


@dataclass(frozen=True)
class StepBudget:
    """What the scheduler allows the next step of one stream, from costs measured where it runs."""

    call_s: float
    """Longest the call may hold a runner slot without another listener running out of audio."""
    due_s: float | None
    """Seconds until this stream's listener runs out of audio; None while it owes its first audio."""
    cost: CostEstimate
    safety: float = 1.0
    """Estimates are multiplied by this before they are compared with ``call_s`` and ``due_s``."""
    own_safety: float = 0.0
    """The margin before ``due_s`` instead, when more than ``safety``: how far the slowest calls have lately overrun
    their estimates. One call that overruns like them must not leave this stream's listener without audio."""
    load: float = 0.0
    """Share of the machine's measured capacity the admitted streams need (0 when unknown): the nearer
    to 1, the more a step must make of its call, so that the machine keeps up."""

    def call_fits(self, call_s: float) -> bool:
        return call_s * self.safety <= self.call_s

    def due_fits(self, to_audio_s: float) -> bool:
        """Whether new audio ``to_audio_s`` after the step starts comes before the listener runs out."""
        return self.due_s is None or to_audio_s * max(self.safety, self.own_safety) <= self.due_s

    @property
    def dry(self) -> bool:
        """The listener is already out of audio (as when the machine slowed down under its load)."""
        return self.due_s is not None and self.due_s <= 0


def still_starting(buffered_s: float | None, load: float, largest_step_audio_s: float | None) -> bool:
    """Whether a stream is still starting: it owes its first audio (``buffered_s`` None), or its listener holds less
    than one round of the machine, the time the machine needs to serve every admitted stream once at the voice's
    largest step (``load`` × that step's audio)."""
    if buffered_s is None:
        return True
    return largest_step_audio_s is not None and buffered_s < load * largest_step_audio_s


@dataclass(frozen=True)
class StartCost:
    """What a stream's start costs beyond its audio's steady cost: its first chunks are small, and each pays the
    call's fixed cost and context again."""

    extra_s: float
    """Compute seconds over the steady cost of the same audio."""
    audio_s: float
    """Audio over which that is spent (the start's chunks, up to the first of the largest size)."""


@dataclass(frozen=True)
class SpokenTiming:
    """When one token of a segment's text (``engine.text.spoken_tokens``) is heard, as the voice knows it."""

    start: int
    """Character offsets of the token in the segment's text."""
    end: int
    start_s: float
    """Seconds from the segment's first sample (speed included)."""
    end_s: float


@dataclass(frozen=True)
class SegmentTimings:
    segment: int
    """The segment's index in the session (0 for its first)."""
    tokens: tuple[SpokenTiming, ...]
    """One per token of the segment's text, in order."""


class VoiceSession(ABC):
    """One stream's model state: the segments it was given and how far it got."""

    segments_done: int = 0
    """Segments whose audio is complete (empty ones included)."""

    @abstractmethod
    def add_segment(self, text: str, rate: float = 1.0) -> None:
        """Queue a text segment for synthesis; ``rate`` multiplies the session's speed for it (SSML's ``prosody
        rate``), the product kept within ``MIN_SPEED``..``MAX_SPEED``; a voice that speaks at one rate ignores it
        (``VoiceInfo.varies_rate``)."""

    @abstractmethod
    def next_step(self) -> Step | None:
        """The step this session needs next, or None when it is waiting for text (or done)."""

    def plan_step(self, budget: StepBudget) -> Step | None:
        """The next step sized to ``budget`` (the largest that fits, else the smallest); like ``next_step``,
        it changes nothing. Sessions whose steps have one size keep this default."""
        return self.next_step()

    def concurrent_step(self) -> Step | None:
        """A step that may run while this session's other step is in flight, on a lane of its own (CosyVoice2's
        token-to-wave chunk while its LM decodes); its kind is never that of the other step, and neither touches
        the state the other's call changes. Like ``next_step``, it changes nothing. Sessions whose steps run one
        at a time keep this default."""
        return None

    @abstractmethod
    def complete(self, step: Step, result: Any) -> np.ndarray | None:
        """Take a step's result; return float32 audio at the voice's rate that is now final."""

    def remaining_audio_s(self) -> float | None:
        """Estimated seconds of audio its queued segments will still make; None when the voice cannot tell."""
        return None

    @property
    @abstractmethod
    def idle(self) -> bool:
        """True when every queued segment has been turned into audio."""

    def take_timings(self) -> list[SegmentTimings]:
        """Exact token timings the voice learned since the last call (a Piper segment's once it is encoded); a
        voice that has none keeps this default, and the stream estimates its word times instead."""
        return []

    def skip_timings(self) -> None:
        """The stream sends no words: ``take_timings`` will not be asked, so a voice that works timings out at a
        cost may stop (called before the first step); a voice whose timings cost nothing keeps this default."""
        return None

    def segment_length_s(self) -> float | None:
        """The current segment's whole audio length once the voice knows it before all of it is made (a
        CosyVoice2 segment's once its LM has stopped), else None: word time estimates are spread over it."""
        return None


class Voice(ABC):
    info: VoiceInfo

    @abstractmethod
    def open_session(self, options: SynthesisOptions) -> VoiceSession:
        """State for one new stream."""

    @abstractmethod
    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        """Run one batch of payloads of one kind (dispatching on their type); one result per payload, in order.
        Called from runner threads, possibly concurrently."""

    def run_wide(self, payloads: Sequence[StepPayload]) -> list[Any]:
        """``run`` with every core of the runner to itself: the scheduler holds all its slots for the call. Only
        for kinds in ``wide_kinds``."""
        return self.run(payloads)

    def wide_kinds(self) -> frozenset[str]:
        """Kinds of call that ``run_wide`` makes sooner than ``run``, with the same results (measured where it
        runs); none by default."""
        return frozenset()

    def max_batch(self, kind: str) -> int:
        """Most steps of ``kind`` worth putting in one call (measured per model and device)."""
        return 1 << 16

    def compute_per_audio_s(self, cost: CostEstimate) -> float | None:
        """Compute seconds per second of audio at this voice's most efficient step sizes, from ``cost``; None
        when the voice cannot tell (the engine then uses the real-time factor it measured)."""
        return None

    def start_cost(self, cost: CostEstimate) -> StartCost | None:
        """What a stream's start costs on top of the steady cost of its audio, from ``cost``; None when the voice
        cannot tell (admission then counts the steady cost only)."""
        return None

    def largest_step_audio_s(self) -> float | None:
        """Audio one step of the largest size releases (what a listener must have buffered for the machine to
        serve every stream once at that size under full load); None when the voice's steps have no such size."""
        return None

    @property
    def cost_key(self) -> Hashable:
        """What the engine learns call costs per: voices that share weights share costs (default: the model)."""
        return self.info.model

    def validate(self, options: SynthesisOptions) -> None:
        """Raise ValueError when this voice cannot honour ``options``; by default it honours every option."""
        return None

    def warmup(self) -> None:
        """Run once so that the first request does not pay for lazy initialisation; by default nothing is lazy."""
        return None
