"""A test hook: make one kind of model call raise for streams whose text carries a marker.

``RTVOICE_FAULT_INJECTION=decode:FAIL-DECODE`` wraps each voice the server loads so that a ``decode`` call
raises when a stream in it is working on a segment (a sentence or clause) containing ``FAIL-DECODE``. Everything else is the real
voice: the real sessions plan the steps, the real model runs every other call. Tests use it to show that a
model call that raises fails its own streams and nothing else. Off (empty) by default; never for production.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rtvoice.engine.models.base import (CostEstimate, SegmentTimings, Step, StepBudget, StepPayload, SynthesisOptions,
                                        Voice, VoiceSession)

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """The failure the hook raises in place of a model call."""


@dataclass(frozen=True)
class Fault:
    kind: str
    """The step kind whose call fails (``encode``, ``flow``, ``decode``; ``lm``, ``token2wav``)."""
    marker: str
    """Text that marks a stream for failure."""


def parse_faults(text: str) -> list[Fault]:
    """``kind:marker`` pairs, comma-separated; ValueError for anything else."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, separator, marker = item.partition(":")
        if not separator or not kind.strip() or not marker.strip():
            raise ValueError(f"RTVOICE_FAULT_INJECTION: {item!r} is not kind:marker")
        faults.append(Fault(kind.strip(), marker.strip()))
    return faults


class _Marked(StepPayload):
    """A step payload of a marked stream, of the same kind: the call it joins raises."""

    def __init__(self, payload: StepPayload) -> None:
        self.payload = payload
        self.kind = payload.kind


class FaultySession(VoiceSession):
    """The voice's own session; its steps of the failing kind carry a mark while the segment they work on (the
    first one not done: segments finish in order) has the marker, so the audio before it is real."""

    def __init__(self, inner: VoiceSession, faults: list[Fault]) -> None:
        self.inner = inner
        self.faults = faults
        self.segment_texts: list[str] = []

    @property
    def segments_done(self) -> int:  # type: ignore[override]
        return self.inner.segments_done

    @property
    def idle(self) -> bool:
        return self.inner.idle

    def add_segment(self, text: str) -> None:
        self.segment_texts.append(text)
        self.inner.add_segment(text)

    def _fails(self, kind: str) -> bool:
        index = self.inner.segments_done
        text = self.segment_texts[index] if index < len(self.segment_texts) else ""
        return any(fault.kind == kind and fault.marker in text for fault in self.faults)

    def next_step(self) -> Step | None:
        return self._marked(self.inner.next_step())

    def plan_step(self, budget: StepBudget) -> Step | None:
        return self._marked(self.inner.plan_step(budget))

    def _marked(self, step: Step | None) -> Step | None:
        if step is None:
            return None
        payload = _Marked(step.payload) if self._fails(step.kind) else step.payload
        return replace(step, payload=payload, session=self)

    def complete(self, step: Step, result: Any) -> np.ndarray | None:
        payload = step.payload.payload if isinstance(step.payload, _Marked) else step.payload
        return self.inner.complete(replace(step, payload=payload, session=self.inner), result)

    def take_timings(self) -> list[SegmentTimings]:
        return self.inner.take_timings()

    def segment_length_s(self) -> float | None:
        return self.inner.segment_length_s()


class FaultyVoice(Voice):
    """A voice whose calls raise ``InjectedFault`` when a marked step is among their payloads."""

    def __init__(self, inner: Voice, faults: list[Fault]) -> None:
        self.inner = inner
        self.faults = faults
        self.info = inner.info

    def __getattr__(self, name: str) -> Any:
        # Anything else a transport reads from a voice (``source``, ``features``) is the real voice's.
        return getattr(self.inner, name)

    def open_session(self, options: SynthesisOptions) -> VoiceSession:
        return FaultySession(self.inner.open_session(options), self.faults)

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        if any(isinstance(payload, _Marked) for payload in payloads):
            raise InjectedFault(f"injected fault: a {payloads[0].kind} call with a marked stream "
                                "(RTVOICE_FAULT_INJECTION)")
        return self.inner.run(payloads)

    def max_batch(self, kind: str) -> int:
        return self.inner.max_batch(kind)

    @property
    def cost_key(self) -> Hashable:
        return self.inner.cost_key

    def compute_per_audio_s(self, cost: CostEstimate) -> float | None:
        return self.inner.compute_per_audio_s(cost)

    def largest_step_audio_s(self) -> float | None:
        return self.inner.largest_step_audio_s()

    def validate(self, options: SynthesisOptions) -> None:
        self.inner.validate(options)

    def warmup(self) -> None:
        self.inner.warmup()


def with_faults(voices: list[Voice], text: str) -> list[Voice]:
    """The voices wrapped by the hook when ``text`` (RTVOICE_FAULT_INJECTION) names faults; else as they are."""
    faults = parse_faults(text)
    if not faults:
        return voices
    log.warning("RTVOICE_FAULT_INJECTION is set (a test hook): calls fail for %s",
                ", ".join(f"{f.kind} steps of text with {f.marker!r}" for f in faults))
    return [FaultyVoice(voice, faults) for voice in voices]
