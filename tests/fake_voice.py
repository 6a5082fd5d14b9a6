"""A Piper-shaped voice without a model, and a simulated engine loop with a clock the test moves.

``FakeVoice`` plans its segments with Piper's own chunk plan (``engine/models/piper/plan.py``): an
encode step, flow windows and decoder chunks with context frames, but its calls compute nothing;
each kind costs ``fixed + per_unit × size`` seconds of simulated time, so a test sets how fast the
machine is. ``Simulation`` drives the real ``Scheduler`` the way ``engine/core.py`` does (pick a
batch while a slot is free, run it, complete it), with calls ending in simulated time: no threads,
no sleeping, the same decisions on every run.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rtvoice.engine.core import EngineCore
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import (
    CostEstimate,
    StartCost,
    Step,
    StepBudget,
    StepPayload,
    SynthesisOptions,
    Voice,
    VoiceInfo,
    VoiceSession,
)
from rtvoice.engine.models.piper.plan import ChunkPlan, DecodeChunk, FlowWindow, Geometry, Planner, Progress
from rtvoice.engine.runner import BatchOutput
from rtvoice.engine.scheduler import Batch, Limits, Scheduler
from rtvoice.engine.stream import SpeechStream
from rtvoice.engine.text import Segmenter

SAMPLE_RATE = 22050
HOP = 256
FRAME_S = HOP / SAMPLE_RATE
FRAMES_PER_CHAR = 5
"""About 58 ms of speech per character, as Piper's English voices speak."""


@dataclass
class Costs:
    """Seconds of one call: ``fixed + per_unit × size`` per kind (sizes as Piper's steps count them)."""

    fixed: dict[str, float] = field(default_factory=lambda: {"encode": 0.004, "flow": 0.002, "decode": 0.003})
    per_unit: dict[str, float] = field(default_factory=lambda: {"encode": 0.0004, "flow": 0.00012, "decode": 0.0009})
    scale: float = 1.0
    squared: dict[str, float] = field(default_factory=dict)
    """Seconds per unit squared (Piper's encoder costs grow faster than its text: attention)."""

    def __call__(self, kind: str, size: int) -> float:
        squared = self.squared.get(kind, 0.0) * size * size
        return self.scale * (self.fixed[kind] + self.per_unit[kind] * size + squared)

    @classmethod
    def piper_like(cls, scale: float = 1.0) -> Costs:
        """About what Piper's medium voice costs on one core of the machines this was written on."""
        return cls(
            fixed={"encode": 0.005, "flow": 0.0005, "decode": 0.0005},
            per_unit={"encode": 0.0003, "flow": 0.000113, "decode": 0.00055},
            squared={"encode": 0.000001},
            scale=scale,
        )


@dataclass
class FakeEncode(StepPayload):
    kind = "encode"
    text: str

    @property
    def size(self) -> int:
        return len(self.text)


@dataclass
class FakeFlow(StepPayload):
    kind = FlowWindow.kind
    window: FlowWindow

    @property
    def size(self) -> int:
        return self.window.size


@dataclass
class FakeDecode(StepPayload):
    kind = DecodeChunk.kind
    chunk: DecodeChunk

    @property
    def size(self) -> int:
        return self.chunk.size


FakePayload = FakeEncode | FakeFlow | FakeDecode


class FakeVoice(Voice):
    def __init__(
        self,
        costs: Costs | None = None,
        plan: ChunkPlan | None = None,
        voice_id: str = "fake",
        wide_kinds: frozenset[str] = frozenset(),
    ) -> None:
        """``wide_kinds``: the kinds it says run sooner on every core (their simulated cost stays the same)."""
        self.info = VoiceInfo(id=voice_id, name=voice_id, language="en", sample_rate=SAMPLE_RATE, model="fake")
        self.costs = costs or Costs()
        self._wide_kinds = wide_kinds
        frame_ms = 1000 * FRAME_S
        self.geometry = Geometry.of(plan or ChunkPlan(), frame_ms, flow_context=32, decoder_context=11)
        self.planner = Planner(self.geometry)

    def open_session(self, options: SynthesisOptions) -> FakeSession:
        return FakeSession(self)

    def largest_step_audio_s(self) -> float | None:
        return self.geometry.max_chunk_s

    def wide_kinds(self) -> frozenset[str]:
        return self._wide_kinds

    def start_cost(self, cost: CostEstimate) -> StartCost | None:
        return self.planner.start_cost(cost)

    def compute_per_audio_s(self, cost: CostEstimate) -> float | None:
        per_frame = self.planner.compute_per_frame(cost)
        if per_frame <= 0:
            return None
        per_frame += cost(FakeEncode.kind, 100) / (100 * FRAMES_PER_CHAR)
        return per_frame / FRAME_S

    def max_batch(self, kind: str) -> int:
        return {FakeEncode.kind: 1 << 16}.get(kind, 1)

    def call_s(self, payloads: Sequence[FakePayload]) -> float:
        """Simulated seconds of one call."""
        return self.costs(payloads[0].kind, sum(p.size for p in payloads))

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        results: list[Any] = []
        for payload in payloads:
            if isinstance(payload, FakeEncode):
                results.append(len(payload.text) * FRAMES_PER_CHAR)
            elif isinstance(payload, FakeFlow):
                results.append(None)
            elif isinstance(payload, FakeDecode):
                results.append(np.full((payload.chunk.end - payload.chunk.start) * HOP, 0.1, dtype=np.float32))
            else:
                raise ValueError(f"a fake voice cannot run {type(payload).__name__}")
        return results


class FakeSession(VoiceSession):
    def __init__(self, voice: FakeVoice) -> None:
        self.voice = voice
        self.pending: list[str] = []
        self.progress: Progress | None = None
        self.chunks: list[int] = []
        """Frames of each decoder chunk, in order."""

    @property
    def idle(self) -> bool:
        return self.progress is None and not self.pending

    def add_segment(self, text: str, rate: float = 1.0) -> None:
        self.pending.append(text)

    def next_step(self) -> Step[FakePayload] | None:
        raise AssertionError("the scheduler plans with budgets")

    def plan_step(self, budget: StepBudget) -> Step[FakePayload] | None:
        planner = self.voice.planner
        if self.progress is None:
            if not self.pending:
                return None
            encode = FakeEncode(self.pending[0])
            return Step(
                (encode.kind,),
                encode,
                self,
                size=encode.size,
                until_audio=(
                    (FakeFlow.kind, planner.first_window_size()),
                    (FakeDecode.kind, planner.first_chunk_size()),
                ),
            )
        action = planner.next(self.progress, budget)
        if isinstance(action, DecodeChunk):
            return Step((action.kind, action.size), FakeDecode(action), self, size=action.size)
        then = planner.chunk(self.progress, planner.chunk_end(self.progress, self.voice.geometry.first_chunk))
        return Step(
            (action.kind, action.size),
            FakeFlow(action),
            self,
            size=action.size,
            until_audio=((FakeDecode.kind, then.size),),
        )

    def remaining_audio_s(self) -> float | None:
        frames = sum(len(text) * FRAMES_PER_CHAR for text in self.pending)
        if self.progress is not None:
            frames += self.progress.frames - self.progress.decoded
        return frames * FRAME_S

    def complete(self, step: Step[FakePayload], result: Any) -> np.ndarray | None:
        payload = step.payload
        if isinstance(payload, FakeEncode):
            self.pending.pop(0)
            self.progress = Progress(result, 0, 0)
            return None
        assert self.progress is not None
        p = self.progress
        if isinstance(payload, FakeFlow):
            self.progress = Progress(p.frames, payload.window.end, p.decoded)
            return None
        chunk = payload.chunk
        self.chunks.append(chunk.end - chunk.start)
        self.progress = Progress(p.frames, p.flowed, chunk.end)
        if chunk.end >= p.frames:
            self.progress = None
            self.segments_done += 1
        return result


class SimulatedRunner:
    """Runs a call at once and says it took what the voice's costs say (for ``EngineCore.calibrate``)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots

    async def run(self, voice: FakeVoice, payloads: Sequence[FakePayload], wide: bool = False) -> BatchOutput:
        return BatchOutput(voice.run(payloads), voice.call_s(payloads))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(order=True)
class _Call:
    ends_at: float
    order: int
    batch: Batch = field(compare=False)
    output: BatchOutput = field(compare=False)


class Simulation:
    """The real scheduler on simulated time: calls take what the fake voice's costs say."""

    def __init__(
        self, voice: FakeVoice, slots: int = 2, limits: Limits | None = None, noise: float = 0.0, seed: int = 0
    ) -> None:
        """``noise``: each call takes its cost times a log-normal factor of this spread (0: exactly its cost),
        drawn from a generator seeded with ``seed``, as on a machine shared with other work."""
        self.voice = voice
        self.noise = noise
        self._random = random.Random(seed)
        self.clock = Clock()
        self.metrics = Metrics()
        self.scheduler = Scheduler(slots, limits or Limits(), self.metrics, clock=self.clock)
        self.streams: list[SpeechStream] = []
        self.calls: list[_Call] = []
        self._arrivals: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def calibrate(self) -> None:
        """The engine's start-up measurement, on the simulated runner."""
        core = EngineCore(self.scheduler, SimulatedRunner(self.scheduler.slots))  # type: ignore[arg-type]
        asyncio.run(core.calibrate([self.voice]))

    def open(self, text: str) -> SpeechStream:
        """A stream with all its text, admitted now (Overloaded past the queue, as in the engine)."""
        stream = SpeechStream(
            self.voice,
            self.voice.open_session(SynthesisOptions()),
            Segmenter(90, 300, "en"),
            SAMPLE_RATE,
            wake=lambda: None,
            clock=self.clock,
            on_end=self.scheduler.stream_ended,
        )
        stream.push_text(text)
        stream.close_input()
        self.scheduler.admit(stream)
        self.streams.append(stream)
        return stream

    def at(self, time_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._arrivals, (time_s, next(self._order), action))

    def _stream_counts(self) -> tuple[int, int]:
        """Streams opened, and those of them closed."""
        return len(self.streams), sum(stream.closed for stream in self.streams)

    def run(self, until: float = float("inf")) -> None:
        """Advance until nothing is left to do (or ``until``). As the engine's loop, it lets streams go and admits
        waiting ones when a call has ended or a stream has come or gone, not at the other events of a test (a
        listener looking whether its utterance has played out)."""
        woken = True
        while True:
            if woken:
                self.scheduler.release()
            while (batch := self.scheduler.pick_batch()) is not None:
                results = self.voice.run(batch.payloads)
                seconds = self.voice.call_s(batch.payloads)  # type: ignore[arg-type]
                if self.noise:
                    seconds *= self._random.lognormvariate(0.0, self.noise)
                heapq.heappush(
                    self.calls, _Call(self.clock.now + seconds, next(self._order), batch, BatchOutput(results, seconds))
                )
            next_call = self.calls[0].ends_at if self.calls else float("inf")
            next_arrival = self._arrivals[0][0] if self._arrivals else float("inf")
            if min(next_call, next_arrival) > until or (not self.calls and not self._arrivals):
                return
            if next_arrival <= next_call:
                self.clock.now = max(self.clock.now, next_arrival)
                before = self._stream_counts()
                heapq.heappop(self._arrivals)[2]()
                woken = self._stream_counts() != before
            else:
                woken = True
                call = heapq.heappop(self.calls)
                self.clock.now = call.ends_at
                self.scheduler.complete(call.batch, call.output)
