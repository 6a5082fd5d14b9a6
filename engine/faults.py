"""A test hook: make one kind of model call raise, or hang, for streams whose text carries a marker.

``RTVOICE_FAULT_INJECTION=decode:FAIL-DECODE`` wraps each voice the server loads so that a ``decode`` call
raises when a stream in it is working on a segment (a sentence or clause) containing ``FAIL-DECODE``;
``decode:HANG-DECODE:hang`` makes such a call block instead, as a deadlocked model would, until the voice's
``released`` event is set (tests set it; a server never does: the call hangs until the process ends).
Everything else is the real voice: the real sessions plan the steps, the real model runs every other call.
Tests use it to show that a model call that raises or hangs fails its own streams and nothing else. Off
(empty) by default; never for production.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from rtvoice.engine.models.base import (
    CostEstimate,
    SegmentTimings,
    StartCost,
    Step,
    StepBudget,
    StepPayload,
    SynthesisOptions,
    Voice,
    VoiceSession,
)

log = logging.getLogger(__name__)


FaultMode = Literal["raise", "hang"]
MODES: tuple[FaultMode, ...] = ("raise", "hang")


class InjectedFault(RuntimeError):
    """The failure the hook raises in place of a model call."""


@dataclass(frozen=True)
class Fault:
    kind: str
    """The step kind whose call fails (``encode``, ``flow``, ``decode``; ``lm``, ``token2wav``)."""
    marker: str
    """Text that marks a stream for failure."""
    mode: FaultMode = "raise"
    """``raise``: the call raises ``InjectedFault``; ``hang``: it blocks until released."""


def parse_faults(text: str) -> list[Fault]:
    """``kind:marker`` or ``kind:marker:mode`` items, comma-separated; ValueError for anything else."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, separator, marker = item.partition(":")
        mode = "raise"
        head, _, tail = marker.rpartition(":")
        if tail.strip() in MODES:
            marker, mode = head, tail.strip()
        if not separator or not kind.strip() or not marker.strip():
            raise ValueError(
                f"RTVOICE_FAULT_INJECTION: {item!r} is not kind:marker or kind:marker:mode (mode {' or '.join(MODES)})"
            )
        faults.append(Fault(kind.strip(), marker.strip(), mode.strip()))  # type: ignore[arg-type]  # one of MODES
    return faults


class _Marked(StepPayload):
    """A step payload of a marked stream, of the same kind: the call it joins raises or hangs, as ``mode`` says."""

    def __init__(self, payload: StepPayload, mode: FaultMode) -> None:
        self.payload = payload
        self.kind = payload.kind
        self.mode = mode


class FaultySession(VoiceSession):
    """The voice's own session; its steps of the failing kind carry a mark while the segment they work on (the
    first one not done: segments finish in order) has the marker, so the audio before it is real."""

    def __init__(self, inner: VoiceSession, faults: list[Fault]) -> None:
        self.inner = inner
        self.faults = faults
        self.segment_texts: list[str] = []

    @property
    def segments_done(self) -> int:  # type: ignore[override]  # a read-only view of the wrapped session's count
        return self.inner.segments_done

    @property
    def idle(self) -> bool:
        return self.inner.idle

    def add_segment(self, text: str, rate: float = 1.0) -> None:
        self.segment_texts.append(text)
        self.inner.add_segment(text, rate)

    def _fault(self, kind: str) -> Fault | None:
        index = self.inner.segments_done
        text = self.segment_texts[index] if index < len(self.segment_texts) else ""
        return next((fault for fault in self.faults if fault.kind == kind and fault.marker in text), None)

    def next_step(self) -> Step | None:
        return self._marked(self.inner.next_step())

    def plan_step(self, budget: StepBudget) -> Step | None:
        return self._marked(self.inner.plan_step(budget))

    def concurrent_step(self) -> Step | None:
        return self._marked(self.inner.concurrent_step())

    def _marked(self, step: Step | None) -> Step | None:
        if step is None:
            return None
        fault = self._fault(step.kind)
        payload = step.payload if fault is None else _Marked(step.payload, fault.mode)
        return replace(step, payload=payload, session=self)

    def complete(self, step: Step, result: Any) -> np.ndarray | None:
        payload = step.payload.payload if isinstance(step.payload, _Marked) else step.payload
        return self.inner.complete(replace(step, payload=payload, session=self.inner), result)

    def take_timings(self) -> list[SegmentTimings]:
        return self.inner.take_timings()

    def skip_timings(self) -> None:
        self.inner.skip_timings()

    def segment_length_s(self) -> float | None:
        return self.inner.segment_length_s()

    def remaining_audio_s(self) -> float | None:
        return self.inner.remaining_audio_s()


class FaultyVoice(Voice):
    """A voice whose calls raise ``InjectedFault``, or hang until ``released`` is set, when a marked step is among
    their payloads."""

    def __init__(self, inner: Voice, faults: list[Fault], released: threading.Event | None = None) -> None:
        self.inner = inner
        self.faults = faults
        self.info = inner.info
        self.released = released or threading.Event()
        """Set: hung calls go on (and run the real model); calls that would hang from then on do not."""

    def __getattr__(self, name: str) -> Any:
        # Anything else a transport reads from a voice (``source``, ``features``) is the real voice's.
        return getattr(self.inner, name)

    def open_session(self, options: SynthesisOptions) -> VoiceSession:
        return FaultySession(self.inner.open_session(options), self.faults)

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        return self._run(payloads, self.inner.run)

    def run_wide(self, payloads: Sequence[StepPayload]) -> list[Any]:
        return self._run(payloads, self.inner.run_wide)

    def wide_kinds(self) -> frozenset[str]:
        return self.inner.wide_kinds()

    def _run(self, payloads: Sequence[StepPayload], run: Callable[[list[StepPayload]], list[Any]]) -> list[Any]:
        modes = {payload.mode for payload in payloads if isinstance(payload, _Marked)}
        if "raise" in modes:
            raise InjectedFault(
                f"injected fault: a {payloads[0].kind} call with a marked stream (RTVOICE_FAULT_INJECTION)"
            )
        if "hang" in modes:
            log.warning(
                "injected fault: the %s call of a marked stream hangs (RTVOICE_FAULT_INJECTION)", payloads[0].kind
            )
            self.released.wait()
        return run([p.payload if isinstance(p, _Marked) else p for p in payloads])

    def max_batch(self, kind: str) -> int:
        return self.inner.max_batch(kind)

    @property
    def cost_key(self) -> Hashable:
        return self.inner.cost_key

    def compute_per_audio_s(self, cost: CostEstimate) -> float | None:
        return self.inner.compute_per_audio_s(cost)

    def largest_step_audio_s(self) -> float | None:
        return self.inner.largest_step_audio_s()

    def start_cost(self, cost: CostEstimate) -> StartCost | None:
        return self.inner.start_cost(cost)

    def validate(self, options: SynthesisOptions) -> None:
        self.inner.validate(options)

    def warmup(self) -> None:
        self.inner.warmup()


def with_faults(voices: list[Voice], text: str) -> list[Voice]:
    """The voices wrapped by the hook when ``text`` (RTVOICE_FAULT_INJECTION) names faults; else as they are."""
    faults = parse_faults(text)
    if not faults:
        return voices
    log.warning(
        "RTVOICE_FAULT_INJECTION is set (a test hook): calls %s",
        ", ".join(
            f"{'hang' if f.mode == 'hang' else 'fail'} for {f.kind} steps of text with {f.marker!r}" for f in faults
        ),
    )
    released = threading.Event()
    return [FaultyVoice(voice, faults, released) for voice in voices]
