"""The engine loop: schedule, execute, update.

Each time a runner slot is free it asks the scheduler for the next batch (``pick_batch``), runs it
on the model runner off the event loop, and hands the output back (``complete``, or ``fail`` when
the call raised), which wakes the loop again. Streams wake it too, when they get text, are
cancelled, or their client catches up.

A call that runs past its deadline (``CallDeadlines``: a multiple of what it may plausibly take, from the
measured costs) is abandoned: its streams fail, its slot is free at once (the runner gives up the call's thread
and starts another), and whatever it returns later is dropped.

At start it also runs each voice's steps through the runner once, smallest and largest sizes, so
the scheduler's cost estimates are measured before the first request; a calibration call that hangs past the
deadlines' cap stops the start with an error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from rtvoice.engine.models.base import StepBudget, StepPayload, SynthesisOptions, Voice, VoiceSession
from rtvoice.engine.runner import BatchOutput, ModelRunner
from rtvoice.engine.scheduler import Batch, Scheduler

log = logging.getLogger(__name__)

CALIBRATION_SEGMENTS = ("Warming up.", "Then a longer sentence to measure the voice, with a clause in it.")
"""Two lengths, so that even the steps sized by their text are measured at two sizes."""
CALIBRATION_MAX_STEPS = 64
"""Enough for every kind of step of a short sentence (a CosyVoice2 LM makes a few dozen tokens first)."""
_SMALLEST = StepBudget(call_s=0.0, due_s=0.0, cost=lambda kind, size: math.inf)
"""Nothing fits: sessions plan their smallest steps."""
_LARGEST = StepBudget(call_s=math.inf, due_s=math.inf, cost=lambda kind, size: 0.0)
"""Everything fits: sessions plan their largest steps."""


class CallAbandoned(RuntimeError):
    """A model call ran past its deadline; the engine stopped waiting for it."""


@dataclass(frozen=True)
class CallDeadlines:
    """How long a model call may run before it is abandoned: ``factor`` times what it may plausibly take, at
    most ``max_s``. What it may plausibly take is its estimate with the scheduler's margin, or the longest a recent
    call of its cost key held its slot when that is more (a floor for small calls, whose estimates jitter dwarfs);
    a call of a key not calibrated at start (no warm-up), or of a kind never measured for its key, gets ``max_s``."""

    factor: float = 10.0
    max_s: float = 60.0

    def deadline_s(self, plausible_s: float | None) -> float:
        """The deadline of a call that may plausibly take ``plausible_s``; None: nothing measured."""
        return min(self.max_s, self.factor * plausible_s) if plausible_s else self.max_s


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, deadlines: CallDeadlines = CallDeadlines()) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.deadlines = deadlines
        self._calibrated: set[Hashable] = set()
        """Cost keys whose calls the calibration measured."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="rtvoice-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.scheduler.cancel_all()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self._schedule()
            except Exception:  # a scheduling bug must not take every stream down with it
                log.exception("scheduler iteration failed")

    def _schedule(self) -> None:
        self.scheduler.release()
        while (batch := self.scheduler.pick_batch()) is not None:
            call = asyncio.get_running_loop().create_task(self._execute(batch))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    def deadline_s(self, batch: Batch) -> float:
        """When ``batch``'s call is abandoned, in seconds from its start."""
        costs, key = self.scheduler.costs, batch.voice.cost_key
        if key not in self._calibrated or not costs.measured(key, batch.kind):
            # A few live calls say too little of how long calls may take on this machine: the cap, until the
            # calibration's calls (the largest steps, every slot busy) have been measured.
            return self.deadlines.deadline_s(None)
        return self.deadlines.deadline_s(max(batch.estimate_s * self.scheduler.safety(), costs.longest_hold_s(key)))

    async def _run(
        self, voice: Voice, payloads: Sequence[StepPayload], deadline_s: float, abandoned: str, wide: bool = False
    ) -> BatchOutput:
        """A call on the runner, abandoned past ``deadline_s`` (``CallAbandoned``, saying ``abandoned``: the runner
        gives up its thread, so the slot is free now and a late result is dropped); its hold of the slot as the
        loop sees it is recorded for the deadlines."""
        start = time.perf_counter()
        try:
            async with asyncio.timeout(deadline_s) as deadline:
                output = await self.runner.run(voice, payloads, wide=wide)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise CallAbandoned(abandoned) from None
        self.scheduler.costs.observe_hold(voice.cost_key, time.perf_counter() - start)
        return output

    async def _execute(self, batch: Batch) -> None:
        deadline_s = self.deadline_s(batch)
        try:
            output = await self._run(
                batch.voice,
                batch.payloads,
                deadline_s,
                f"its {batch.kind} model call ran past its deadline of {deadline_s:.2f} s "
                f"(estimated {batch.estimate_s:.3f} s) and was abandoned",
                batch.wide,
            )
        except CallAbandoned as abandoned:
            self.scheduler.metrics.calls_abandoned.labels(batch.kind).inc()
            self.scheduler.fail(batch, abandoned)  # its one log line
        except Exception as error:
            log.exception("%s call failed", batch.kind)
            self.scheduler.fail(batch, error)
        else:
            self.scheduler.complete(batch, output)
        finally:
            self.wake()

    async def calibrate(self, voices: list[Voice]) -> None:
        """Measure each cost key's calls at the smallest and the largest step sizes, on every runner slot at once
        (calls cost more when the slots share the cores, and capacity is what they make together)."""
        seen = set()
        for voice in voices:
            if voice.cost_key in seen:
                continue
            seen.add(voice.cost_key)
            session = voice.open_session(SynthesisOptions(seed=0))
            budgets = [_SMALLEST]
            if type(session).plan_step is not VoiceSession.plan_step:  # its steps come in sizes
                budgets.append(_LARGEST)
            for budget in budgets:
                await asyncio.gather(*(self._calibrate(voice, budget) for _ in range(self.runner.slots)))
            self._calibrated.add(voice.cost_key)

    async def _calibrate(self, voice: Voice, budget: StepBudget) -> None:
        costs = self.scheduler.costs
        session = voice.open_session(SynthesisOptions(seed=0))
        for text in CALIBRATION_SEGMENTS:
            session.add_segment(text)
        for _ in range(CALIBRATION_MAX_STEPS):
            step = session.plan_step(budget)
            if step is None:
                return
            output = await self._run(  # nothing measured yet: the cap
                voice,
                [step.payload],
                self.deadlines.max_s,
                f"calibrating voice {voice.info.id}: its {step.kind} model call ran past {self.deadlines.max_s:g} s "
                "(RTVOICE_MODEL_CALL_DEADLINE_MAX_S)",
            )
            costs.observe_call(
                voice.cost_key, step.kind, step.size, output.seconds, all_slots_busy=True, overrun_counts=False
            )
            audio = session.complete(step, output.results[0])
            audio_s = 0.0 if audio is None else len(audio) / voice.info.sample_rate
            costs.observe_output(voice.cost_key, output.seconds, audio_s)
