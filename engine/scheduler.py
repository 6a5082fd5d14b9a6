"""The one scheduler every transport submits to: its books, the next batch, and applying its results.

Like vLLM's, it is driven from outside (``engine/core.py``) in three moves: ``pick_batch`` chooses
the next call, the runner runs it, ``complete`` applies the results. It keeps its own books (which
streams are admitted or queued, which have a step in flight, which calls run and when they should
end) and touches streams only through their methods.

- **Admission** is ``engine/admission.py``'s (whether the runner slots can take one more stream);
  the scheduler asks it for each newcomer and the head of its queue, queues a stream it turns away
  (past ``max_queued_streams``: ``Overloaded``, with a Retry-After from the rate at which streams
  have been finishing) and exports each admitted stream's wait (``rtvoice_queue_wait_seconds``).
  Capacity and load come from ``engine/capacity.py``.
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
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rtvoice.engine import admission, policy
from rtvoice.engine.admission import DEPARTURES_KEPT, is_starting, smallest_step
from rtvoice.engine.capacity import Load, audio_per_s, machine_load
from rtvoice.engine.cost import CostModel
from rtvoice.engine.errors import Overloaded
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import Step, StepBudget, StepPayload, Voice
from rtvoice.engine.playback import Played
from rtvoice.engine.runner import BatchOutput
from rtvoice.engine.stream import SpeechStream, StreamState

log = logging.getLogger(__name__)


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

    # -- admitted and queued streams ----------------------------------------------------------------

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
        return admission.has_room(
            newcomer,
            [stream for stream in self.active if self._needs_audio(stream)],
            self._slots_free_at(self.clock()),
            self.costs,
            self.limits.max_load,
            self.safety(),
            lambda: self.load().fraction,
        )

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
        return admission.retry_after_s(self._departures, len(self.waiting))

    def load(self) -> Load:
        """What the admitted streams with work left need against what the runner slots make."""
        return machine_load(
            self.costs,
            self.slots,
            (stream.voice for stream in self.active if self._needs_audio(stream)),
            (stream.voice for stream in self.active + list(self.waiting)),
        )

    def capacity(self, voice: Voice) -> float | None:
        """Audio seconds per second this machine makes with ``voice``; None before any measurement."""
        return audio_per_s(self.costs, self.slots, voice)

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
            smallest = smallest_step(stream, self.costs.estimator(stream.voice.cost_key), safety)
            if smallest is None:
                continue
            playback = stream.playback
            # Owing first audio has a tier of its own; playing but still starting, the slowest calls' margin.
            starting = not playback.owes_first_audio and is_starting(stream, load)
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
