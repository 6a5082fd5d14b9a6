"""The one scheduler every transport submits to: admission, the next batch, and applying its results.

Like vLLM's, it is driven from outside (``engine/core.py``) in three moves: ``pick_batch`` chooses
the next call, the runner runs it, ``complete`` applies the results. It keeps its own books (which
streams have a step in flight, which calls run and when they should end) and touches streams only
through their methods.

- **Admission** weighs what the admitted streams still need against what the runner slots make,
  both from costs measured on this machine (``engine/cost.py``): each stream needs its next steps
  before its listener runs out, then its voice's compute per second of audio for the audio it has
  still to make (all of it while more text may come), and, while it is starting, what its small
  first chunks cost beyond that (``Voice.start_cost``, spread over their audio). A newcomer is
  admitted when ``max_load`` of the slots' time, over how far calls have lately overrun their
  estimates (``CostModel.surprise``), serves all of them by those due times
  (``schedulable``: a stream far ahead of its listener, or near its end, needs little), and fewer
  streams than runner slots are starting;
  otherwise it waits in the queue (past ``max_queued_streams``: ``Overloaded``, with a Retry-After
  from the rate at which streams have been finishing), so admitted listeners never stall because of
  a newcomer. Each admitted stream's wait is exported (``rtvoice_queue_wait_seconds``).
- **Order** and **call length** come from ``engine/policy.py``; the head stream's session sizes
  its step to the call budget (``VoiceSession.plan_step``).
- **Batching**: other ready steps with the head's batch key share its call, up to
  ``max_batch_size``, the voice's limit for the kind, an even share of the ready work per free
  slot, and the call budget.

A stream has at most one step in flight, so its session is never touched by two threads; a stream
far ahead of its client waits (backpressure).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from rtvoice.engine import policy
from rtvoice.engine.cost import CostModel
from rtvoice.engine.errors import Overloaded
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import CostEstimate, StartCost, Step, StepBudget, StepPayload, Voice, still_starting
from rtvoice.engine.playback import Played
from rtvoice.engine.runner import BatchOutput
from rtvoice.engine.stream import SpeechStream, StreamState

log = logging.getLogger(__name__)

DEPARTURES_KEPT = 32
"""Finished streams remembered for the rate at which places free up (Retry-After)."""


@dataclass(frozen=True)
class Limits:
    max_active_streams: int = 32
    max_queued_streams: int = 64
    max_batch_size: int = 8
    max_load: float = 0.9
    """Demand admitted streams may place on the measured capacity (1.0: all of it), over how far calls have lately
    overrun their estimates."""
    cost_safety: float = 1.5
    """Cost estimates are multiplied by this (or by their measured overrun, when more) wherever they decide
    whether a listener is served in time."""
    idle_cores_for_first_audio: bool = True
    """A lone stream's calls before its first audio hold every runner slot and run on all their cores, for the
    kinds its voice runs sooner that way (``Voice.wide_kinds``)."""


@dataclass(frozen=True)
class Decision:
    """One scheduling decision, kept for inspection: which streams' steps ran together."""

    kind: str
    stream_ids: tuple[int, ...]


@dataclass(eq=False)
class Batch:
    """One model call: steps of one kind, one per stream."""

    voice: Voice
    kind: str
    items: list[tuple[SpeechStream, Step]]
    estimate_s: float
    """Its estimated duration when it was picked."""
    started_at: float
    all_slots_busy: bool = False
    """Every runner slot held a call when it started."""
    wide: bool = False
    """It holds every runner slot and runs on all their cores (``Voice.run_wide``)."""

    @property
    def payloads(self) -> list[StepPayload]:
        return [step.payload for _, step in self.items]

    @property
    def size(self) -> int:
        return sum(step.size for _, step in self.items)


@dataclass
class Load:
    """What admitted streams need against what this machine makes, per cost key and in all."""

    demand: dict[Hashable, int] = field(default_factory=dict)
    """Streams with work left, each needing one second of audio per second."""
    capacity: dict[Hashable, float] = field(default_factory=dict)
    """Audio seconds per second the runner slots make, per cost key with a measured real-time factor."""

    @property
    def fraction(self) -> float:
        """Share of capacity in use (compute-weighted over voices); 0 with no estimate yet."""
        return sum(count / self.capacity[key] for key, count in self.demand.items() if key in self.capacity)


@dataclass(frozen=True)
class Need:
    """What one stream needs of the runner slots, as admission sees it: compute seconds due by each time."""

    start_s: float
    """Compute of its smallest next step and those that must follow it before new audio."""
    due_at: float
    """When that audio is due: its listener runs out (or, owing first audio, as soon as those steps can run)."""
    per_audio_s: float
    """Compute seconds per second of audio after it (the voice's steady cost, measured here)."""
    remaining_s: float
    """Audio it has still to make (``math.inf`` while more text may come)."""
    start_extra_s: float = 0.0
    """What the rest of its start costs over the steady cost (small first chunks), spread over ``start_audio_s``."""
    start_audio_s: float = 0.0

    def by(self, t: float) -> float:
        """Compute seconds it needs done by ``t`` for its listener to hear no gap."""
        if t < self.due_at:
            return 0.0
        audio = min(self.remaining_s, t - self.due_at)
        start = self.start_extra_s * min(1.0, audio / self.start_audio_s) if self.start_audio_s > 0 else 0.0
        return self.start_s + self.per_audio_s * audio + start


def schedulable(newcomer: Need, admitted: list[Need], slots_free_at: list[float], max_load: float) -> bool:
    """Whether ``max_load`` of the runner slots' time (each slot free at its ``slots_free_at``) serves the admitted
    streams and the newcomer by their due times, from the newcomer's first due time on (a demand-bound test, as
    for earliest-deadline-first scheduling, and the steady rate of the streams whose input is open).

    Demand (the sum of ``Need.by``) and supply are piecewise linear in time, and demand only jumps up, so it
    suffices to compare them where either changes: one sweep over those times in order, O(n log n) in the needs."""
    needs = [*admitted, newcomer]
    if sum(n.per_audio_s for n in needs if math.isinf(n.remaining_s)) > max_load * len(slots_free_at):
        return False
    # Each change as (time, change in the line's value at ``origin``, change in its slope), times from ``origin`` so
    # that the lines' values do not lose precision to the clock's magnitude. Demand less supply: a slot free at
    # ``free`` supplies max_load * (t - free) from then on.
    origin = min(slots_free_at)
    changes = [(free - origin, max_load * (free - origin), -max_load) for free in slots_free_at]
    for n in needs:
        changes.extend(_demand_changes(n, origin))
    changes.sort(key=lambda change: change[0])
    value = slope = 0.0
    since = newcomer.due_at - origin
    for t, value_change, slope_change in changes:
        # Every change adds nothing or a step up at its own time, so checking after each one in turn is as good as
        # after all those at one time.
        value += value_change
        slope += slope_change
        if t >= since and value + slope * t > 1e-9:
            return False
    return True


def _demand_changes(need: Need, origin: float) -> list[tuple[float, float, float]]:
    """Where ``need.by`` changes, as (time from ``origin``, change in its line's value at ``origin``, change in its
    slope)."""
    due = need.due_at - origin
    if not math.isfinite(due):
        return []
    rate = need.per_audio_s
    changes = [(due, need.start_s - rate * due, rate)]  # a step up to its start, then the steady rate
    start_audio = min(need.start_audio_s, need.remaining_s)
    if start_audio > 0 and need.start_extra_s > 0:  # its start's extra cost, spread over its first audio
        extra_rate = need.start_extra_s / need.start_audio_s
        changes += [
            (due, -extra_rate * due, extra_rate),
            (due + start_audio, extra_rate * (due + start_audio), -extra_rate),
        ]
    if math.isfinite(need.remaining_s):  # nothing more once its audio is all made
        end = due + need.remaining_s
        changes.append((end, rate * end, -rate))
    return changes


@dataclass(frozen=True)
class _VoiceRates:
    """One voice's figures for admission, as measured calls cost while every runner slot is busy."""

    cost: CostEstimate
    per_audio_s: float
    """Compute seconds per second of audio at its steady step sizes."""
    start: StartCost | None
    """What a start costs over that (``Voice.start_cost``); None when the voice cannot tell."""


@dataclass(frozen=True)
class _SmallestStep:
    """A stream's smallest next step, as the policy and admission see it."""

    step: Step
    step_s: float
    """Estimated seconds of its call."""
    to_audio_s: float
    """Estimated seconds from its start to the stream's next audio."""


class Scheduler:
    def __init__(
        self,
        slots: int,
        limits: Limits,
        metrics: Metrics,
        costs: CostModel | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = slots
        self.limits = limits
        self.metrics = metrics
        self.costs = costs or CostModel()
        self.clock = clock
        self.active: list[SpeechStream] = []
        self.waiting: deque[SpeechStream] = deque()
        self.running: list[Batch] = []
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self._busy: set[int] = set()
        """Streams with a step in flight."""
        self._departures: deque[float] = deque(maxlen=DEPARTURES_KEPT)
        self._watched: set[str] = set()
        metrics.demand.set_function(lambda: sum(self.load().demand.values()))
        metrics.load.set_function(lambda: self.load().fraction)

    # -- admission ----------------------------------------------------------------------------------

    def admit(self, stream: SpeechStream) -> None:
        """Take a new stream: active when there is room for it, else queued; Overloaded past the queue."""
        if not self.waiting and self._has_room_for(stream):
            self.active.append(stream)
            self.metrics.queue_wait.observe(0.0)
        elif len(self.waiting) < self.limits.max_queued_streams:
            self.waiting.append(stream)
        else:
            self.metrics.rejected.inc()
            raise Overloaded(retry_after_s=self.retry_after_s())
        self._update_gauges()

    def _has_room_for(self, newcomer: SpeechStream) -> bool:
        if len(self.active) >= self.limits.max_active_streams:
            return False
        now = self.clock()
        slots_free_at = self._slots_free_at(now)
        safety = self.safety()
        rates: dict[Hashable, _VoiceRates | None] = {}  # each voice's figures once per test, not per stream

        def need(stream: SpeechStream) -> Need | None:
            key = stream.voice.cost_key
            if key not in rates:
                rates[key] = self._rates(stream.voice)
            return self._need(stream, rates[key], min(slots_free_at), safety)

        own = need(newcomer)
        needs = [need(stream) for stream in self.active if self._needs_audio(stream)]
        measured = [n for n in needs if n is not None]
        if own is None or not needs or len(measured) < len(needs):
            return True  # nothing measured yet, or nothing else needs the machine: serve it
        # The share of the slots' time that may be spoken for shrinks by how far calls have lately overrun their
        # estimates: that much room is left for a slow spell, and the listeners' buffers are not spent on it.
        if not schedulable(own, measured, slots_free_at, self.limits.max_load / self.costs.surprise()):
            return False
        # A start costs more than steady speech (first audio, then building a buffer): no more streams
        # starting at once than there are runner slots, so that those playing keep their buffers. Looser counts,
        # measured with bench.load (46 listeners joining over 1 s): half a round as the threshold stalled 2
        # listeners; a stream counted only until it first holds a round, with start costs at the first chunk the
        # plan takes under load, stalled 41.
        return self._starting(self.load().fraction) < self.slots

    def _rates(self, voice: Voice) -> _VoiceRates | None:
        """``voice``'s figures for admission, from costs measured on this machine as calls cost while every slot is
        busy; None before any measurement."""
        cost = self.costs.estimator(voice.cost_key, all_slots_busy=True)
        per_audio = voice.compute_per_audio_s(cost) or self.costs.real_time_factor(voice.cost_key)
        if not per_audio:
            return None
        start = voice.start_cost(cost)
        return _VoiceRates(cost, per_audio, start if start is not None and start.audio_s > 0 else None)

    def _need(self, stream: SpeechStream, rates: _VoiceRates | None, slot_free_at: float, safety: float) -> Need | None:
        """What ``stream`` needs of the runner slots from now on, at its voice's ``rates`` and the margin ``safety``
        on estimates, when the first slot is free at ``slot_free_at``; None before any measurement."""
        if rates is None:
            return None
        remaining = stream.session.remaining_audio_s() if stream.input_closed else None
        if remaining is None:
            remaining = math.inf  # more text may come: it needs audio for as long as it lasts
        smallest = self._smallest_step(stream, rates.cost, safety)
        to_audio = smallest.to_audio_s if smallest is not None else 0.0
        due_at = stream.playback.runs_out_at
        if due_at is None:  # first audio: as soon as its steps can run, with the margin on estimates
            due_at = slot_free_at + safety * to_audio
        start = rates.start
        if start is None:
            return Need(to_audio, due_at, rates.per_audio_s, remaining)
        # The part of its start still ahead (by the audio it has made), with the margin on estimates, spread evenly
        # over its audio. Counting it as the ramp spends it instead (most on the first chunks, the newcomer's too)
        # made 18 listeners joining over 1 s wait longer (bench.load, TTFA p95 585 and 731 ms against 387 and 424).
        start_left_s = max(0.0, min(start.audio_s - stream.playback.audio_s, remaining))
        start_extra_s = safety * start.extra_s * start_left_s / start.audio_s
        return Need(to_audio, due_at, rates.per_audio_s, remaining, start_extra_s, start_left_s)

    @staticmethod
    def _smallest_step(stream: SpeechStream, cost: CostEstimate, safety: float) -> _SmallestStep | None:
        """The least ``stream`` needs to run before new audio: its smallest next step (nothing fits a zero budget),
        with its call's and its time to audio (the steps that must follow it included) by ``cost``; None when it
        has no step to run."""
        budget = StepBudget(0.0, None if stream.playback.owes_first_audio else 0.0, cost, safety)
        step = stream.session.plan_step(budget)
        if step is None:
            return None
        step_s = cost(step.kind, step.size)
        return _SmallestStep(step, step_s, step_s + sum(cost(kind, size) for kind, size in step.until_audio))

    def _starting(self, load: float) -> int:
        """Streams with work that are starting: they owe their first audio, or their listener's buffer, right
        after their last audio, held less than one round of the machine (the time it needs to serve every
        admitted stream once at its voice's largest step: ``load`` × that step's audio)."""
        return sum(1 for stream in self.active if self._needs_audio(stream) and self._is_starting(stream, load))

    @staticmethod
    def _is_starting(stream: SpeechStream, load: float) -> bool:
        """``still_starting`` for ``stream``: it owes its first audio, or holds less than a round of the machine."""
        playback = stream.playback
        buffered = None if playback.owes_first_audio else playback.buffered_s
        return still_starting(buffered, load, stream.voice.largest_step_audio_s())

    def release(self) -> None:
        """Let ended streams go (finishing those whose input is all synthesised) and admit waiting ones."""
        now = self.clock()
        for stream in list(self.active):
            if not stream.closed and self._finished(stream):
                stream.finish()
            if stream.closed and stream.id not in self._busy:
                self.active.remove(stream)
                self._departures.append(now)
        for stream in [s for s in self.waiting if s.closed]:
            self.waiting.remove(stream)
        while self.waiting and self._has_room_for(self.waiting[0]):
            stream = self.waiting.popleft()
            self.active.append(stream)
            self.metrics.queue_wait.observe(now - stream.created_at)  # it joined the queue as it arrived
        self._update_gauges()

    def _finished(self, stream: SpeechStream) -> bool:
        return stream.input_closed and stream.session.idle and stream.id not in self._busy

    def stream_ended(self, stream: SpeechStream) -> None:
        """A stream's ``on_end``: its outcome, at once (the slot is freed at the next ``release``)."""
        self.metrics.streams.labels(stream.state.value).inc()
        if stream.state is StreamState.DONE and stream.emitted_s > 0:
            self.metrics.real_time_factor.labels(stream.voice.info.id).observe(stream.compute_s / stream.emitted_s)

    def retry_after_s(self) -> int:
        """Seconds until a place is likely free: the queue ahead over the rate at which streams have finished."""
        if len(self._departures) < 2:
            return 1
        span = self._departures[-1] - self._departures[0]
        if span <= 0:
            return 1
        rate = (len(self._departures) - 1) / span
        return max(1, min(60, math.ceil((len(self.waiting) + 1) / rate)))

    def load(self) -> Load:
        load = Load()
        for stream in self.active:
            if self._needs_audio(stream):
                key = stream.voice.cost_key
                load.demand[key] = load.demand.get(key, 0) + 1
        for stream in self.active + list(self.waiting):
            key = stream.voice.cost_key
            if key not in load.capacity:
                capacity = self.capacity(stream.voice)
                if capacity is not None:
                    load.capacity[key] = capacity
        return load

    def capacity(self, voice: Voice) -> float | None:
        """Audio seconds per second this machine makes with ``voice``; None before any measurement.

        From the voice's cost at its most efficient step sizes when it can tell (the plan reaches them
        under load), as calls cost while every runner slot is busy; else from the real-time factor measured
        on its recent work."""
        rtf = voice.compute_per_audio_s(self.costs.estimator(voice.cost_key, all_slots_busy=True))
        if rtf is None:
            rtf = self.costs.real_time_factor(voice.cost_key)
        return self.slots / rtf if rtf else None

    def _needs_audio(self, stream: SpeechStream) -> bool:
        if stream.closed or stream.throttled:
            return False
        return stream.id in self._busy or not stream.session.idle

    def _update_gauges(self) -> None:
        self.metrics.active_streams.set(len(self.active))
        self.metrics.queued_streams.set(len(self.waiting))

    def watch(self, voice: Voice) -> None:
        """Export ``voice``'s capacity (read when the metrics are scraped); for the server's own voices, not
        one-off ones, so that the metric's labels stay few."""
        if voice.info.id not in self._watched:
            self._watched.add(voice.info.id)
            self.metrics.capacity.labels(voice.info.id).set_function(lambda: self.capacity(voice) or 0.0)

    # -- schedule -----------------------------------------------------------------------------------

    def _slots_free_at(self, now: float) -> list[float]:
        """When each runner slot is free, by the estimates of the calls in flight; idle slots (``now``) last."""
        free_at = [max(now, b.started_at + b.estimate_s) for b in self.running for _ in range(self._held(b))]
        return free_at + [now] * (self.slots - len(free_at))

    def _held(self, batch: Batch) -> int:
        return self.slots if batch.wide else 1

    def _slots_held(self) -> int:
        return sum(self._held(b) for b in self.running)

    def pick_batch(self) -> Batch | None:
        """The next call while a runner slot is free: the most pressing step, sized to the call budget,
        and the steps that can share its call. The batch counts as running until ``complete``/``fail``."""
        if self._slots_held() >= self.slots:
            return None
        now = self.clock()
        safety = self.safety()
        ready: list[policy.Ready] = []
        streams: dict[int, SpeechStream] = {}
        load = self.load().fraction
        tail = self.costs.tail_surprise()
        for stream in self.active:
            if stream.id in self._busy or stream.closed or stream.throttled:
                continue
            smallest = self._smallest_step(stream, self.costs.estimator(stream.voice.cost_key), safety)
            if smallest is None:
                continue
            playback = stream.playback
            # Owing first audio has a tier of its own; playing but still starting, the slowest calls' margin.
            starting = not playback.owes_first_audio and self._is_starting(stream, load)
            ready.append(
                policy.Ready(
                    stream.id,
                    smallest.step,
                    smallest.step_s,
                    smallest.to_audio_s,
                    playback.runs_out_at,
                    playback.owed_since,
                    tail if starting else 0.0,
                )
            )
            streams[stream.id] = stream
        if not ready:
            return None
        ordered = policy.order(ready, now, safety)
        head, others = ordered[0], ordered[1:]
        head_stream = streams[head.stream_id]
        other_slots = self._slots_free_at(now)[:-1]  # all but an idle slot: the head's
        call_s = policy.call_budget(others, now, other_slots, safety)
        cost = self.costs.estimator(head_stream.voice.cost_key)
        step = head_stream.session.plan_step(
            StepBudget(
                call_s=call_s,
                due_s=head_stream.playback.due_in(now),
                cost=cost,
                safety=safety,
                own_safety=tail,
                load=load,
            )
        )
        assert step is not None
        items = [(head_stream, step)]
        # Split ready work over the free runner slots rather than queueing it all behind one call.
        compatible = [r for r in others if r.step.batch_key == step.batch_key]
        free_slots = max(1, self.slots - self._slots_held())
        limit = min(
            self.limits.max_batch_size, head_stream.voice.max_batch(step.kind), -(-(len(compatible) + 1) // free_slots)
        )
        size = step.size
        for r in compatible:
            if len(items) >= limit or cost(step.kind, size + r.step.size) * safety > max(call_s, cost(step.kind, size)):
                break
            items.append((streams[r.stream_id], r.step))
            size += r.step.size
        batch = Batch(
            head_stream.voice,
            step.kind,
            items,
            cost(step.kind, size),
            now,
            wide=self._lends_every_core(head_stream, step, items, ready),
        )
        self._start(batch)
        return batch

    def _lends_every_core(
        self, stream: SpeechStream, step: Step, items: list[tuple[SpeechStream, Step]], ready: list[policy.Ready]
    ) -> bool:
        """Whether a call runs on every runner core: it is the only work there is (no other call in flight, no
        other stream ready, none queued), it comes before its stream's first audio, and its voice runs its kind
        sooner that way. A newcomer then waits for it at most one such short call."""
        return (
            self.limits.idle_cores_for_first_audio
            and self.slots > 1
            and not self.running
            and not self.waiting
            and len(items) == 1
            and len(ready) == 1
            and stream.playback.owes_first_audio
            and step.kind in stream.voice.wide_kinds()
        )

    def safety(self) -> float:
        """The margin on cost estimates: the configured factor, or how much longer than estimated calls have
        lately taken when that is more (a machine whose speed jumps, e.g. shared with other work)."""
        return max(self.limits.cost_safety, self.costs.surprise())

    def _start(self, batch: Batch) -> None:
        self.running.append(batch)
        batch.all_slots_busy = self._slots_held() == self.slots
        for stream, _ in batch.items:
            self._busy.add(stream.id)
        self.decisions.append(Decision(batch.kind, tuple(stream.id for stream, _ in batch.items)))
        if batch.wide:
            self.metrics.wide_calls.labels(batch.kind).inc()
        self.metrics.batch_size.labels(batch.kind).observe(len(batch.items))

    # -- update -------------------------------------------------------------------------------------

    def complete(self, batch: Batch, output: BatchOutput) -> None:
        """Apply a finished call: its cost to the estimates, each result to its stream."""
        now = self.clock()
        self._end(batch)
        key = batch.voice.cost_key
        if not batch.wide:  # the estimates are of calls on one slot's cores
            self.costs.observe_call(key, batch.kind, batch.size, output.seconds, batch.all_slots_busy)
        self.metrics.step_seconds.labels(batch.kind).observe(output.seconds)
        share = output.seconds / len(batch.items)
        for (stream, step), result in zip(batch.items, output.results, strict=True):
            if stream.closed:
                continue  # cancelled while its step ran: drop the result
            try:
                delivered = stream.deliver(step, result, share, now)
            except Exception as error:
                log.exception("stream %s failed", stream.id)
                stream.fail(error)
                continue
            self.costs.observe_output(key, share, delivered.audio_s)
            if delivered.played is not None:
                self._record_audio(stream, delivered.audio_s, delivered.played)
        self._update_gauges()

    def fail(self, batch: Batch, error: Exception) -> None:
        """A call raised: its streams fail, others go on."""
        self._end(batch)
        log.error("%s call failed for streams %s: %s", batch.kind, [s.id for s, _ in batch.items], error)
        for stream, _ in batch.items:
            stream.fail(error)

    def _end(self, batch: Batch) -> None:
        self.running.remove(batch)
        for stream, _ in batch.items:
            self._busy.discard(stream.id)

    def _record_audio(self, stream: SpeechStream, audio_s: float, played: Played) -> None:
        voice = stream.voice.info.id
        m = self.metrics
        m.audio_seconds.labels(voice).inc(audio_s)
        if played.ttfa_s is not None:
            m.ttfa.labels(voice).observe(played.ttfa_s)
        if played.late_s > 0:
            m.late_chunks.inc()
            m.stall_seconds.inc(played.late_s)

    def cancel_all(self) -> None:
        for stream in self.active + list(self.waiting):
            stream.cancel()
        self.active.clear()
        self.waiting.clear()
