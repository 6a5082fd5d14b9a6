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

A stream has at most one step in flight on each of its two lanes: the main one (``plan_step``) and, for a
session that has one, the concurrent one (``VoiceSession.concurrent_step``: CosyVoice2's token-to-wave chunk while
its LM keeps decoding); the two steps are of different kinds and touch different state, and results are applied
on the event loop. A stream far ahead of its client waits (backpressure).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

from rtvoice.engine import admission, policy
from rtvoice.engine.admission import DEPARTURES_KEPT, is_starting, smallest_step
from rtvoice.engine.capacity import Load, audio_per_s, machine_load
from rtvoice.engine.cost import CostModel
from rtvoice.engine.errors import Overloaded
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import CostEstimate, Step, StepBudget, StepPayload, Voice
from rtvoice.engine.playback import Played
from rtvoice.engine.runner import BatchOutput
from rtvoice.engine.stream import SpeechStream, StreamState

log = logging.getLogger(__name__)

DECISIONS_KEPT = 1000
"""Recent decisions kept for inspection."""
RECENT_CALLS = 64
"""Calls of a kind over which its mean batch is exported (``rtvoice_mean_batch_size``)."""


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


Lane = Literal["main", "concurrent"]


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
    lanes: list[Lane]
    """Each item's lane on its stream."""
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
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self._busy: dict[int, dict[Lane, str]] = {}
        """Streams with a step in flight: the kind in flight on each busy lane."""
        self._departures: deque[float] = deque(maxlen=DEPARTURES_KEPT)
        self._last_keys: dict[int, Hashable] = {}
        """Each admitted stream's last main-lane batch key."""
        self._recent_sizes: dict[str, deque[int]] = {}
        """The sizes of each kind's last calls, for its mean batch."""
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
                self._last_keys.pop(stream.id, None)
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
        lanes: dict[int, Lane] = {}
        """Each ready entry's lane, by the entry's id."""
        for stream in self.active:
            if stream.closed or stream.throttled:
                continue
            for lane, step_s, ready_step, to_audio_s in self._ready_steps(stream, safety):
                playback = stream.playback
                # Owing first audio has a tier of its own; playing but still starting, the slowest calls' margin.
                starting = not playback.owes_first_audio and is_starting(stream, load)
                entry = policy.Ready(
                    stream.id,
                    ready_step,
                    step_s,
                    to_audio_s,
                    playback.runs_out_at,
                    playback.owed_since,
                    tail if starting else 0.0,
                )
                ready.append(entry)
                lanes[id(entry)] = lane
            streams[stream.id] = stream
        ready = [r for r in ready if not self._joins_next_call(r, streams[r.stream_id], now, safety)]
        if not ready:
            return None
        ordered = policy.order(ready, now, safety)
        head, others = ordered[0], ordered[1:]
        head_stream = streams[head.stream_id]
        head_lane = lanes[id(head)]
        other_slots = self._slots_free_at(now)[:-1]  # all but an idle slot: the head's
        call_s = policy.call_budget(others, now, other_slots, safety)
        cost = self.costs.estimator(head_stream.voice.cost_key)
        step: Step | None = head.step
        if head_lane == "main":
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
        item_lanes: list[Lane] = [head_lane]
        # Split ready work over the free runner slots rather than queueing it all behind one call.
        compatible = [r for r in others if r.step.batch_key == step.batch_key and r.stream_id != head.stream_id]
        free_slots = max(1, self.slots - self._slots_held())
        limit = min(self.limits.max_batch_size, head_stream.voice.max_batch(step.kind), len(compatible) + 1)
        share = -(-limit // free_slots)
        if self._splits(cost, step.kind, step.size, limit, share, free_slots):
            limit = share
        size = step.size
        # Streams that join the call are served by it: only those left out wait for its slot (none can join a call
        # of one step, so no budget is worked out for it).
        join_s = call_s
        if limit > 1 and compatible:
            joining = {r.stream_id for r in compatible[: limit - 1]}
            waiting = [r for r in others if r.stream_id not in joining and r.stream_id != head.stream_id]
            join_s = policy.call_budget(waiting, now, other_slots, safety)
        for r in compatible:
            if len(items) >= limit or cost(step.kind, size + r.step.size) * safety > max(join_s, cost(step.kind, size)):
                break
            items.append((streams[r.stream_id], r.step))
            item_lanes.append(lanes[id(r)])
            size += r.step.size
        batch = Batch(
            head_stream.voice,
            step.kind,
            items,
            item_lanes,
            cost(step.kind, size),
            now,
            wide=self._lends_every_core(head_stream, step, items, ready),
        )
        self._start(batch)
        return batch

    def _joins_next_call(self, entry: policy.Ready, stream: SpeechStream, now: float, safety: float) -> bool:
        """Whether ``entry`` waits for a call of its batch key in flight, to share the next one: its voice batches
        the kind almost for free (one more row costs under half a row alone), its stream's last call was of the same
        key (it is decoding), the call ends within one of the entry's own calls, and the wait leaves its listener
        served. Else a stream out of step with the others
        runs alone beside their batch, and stays out of step (mean LM batch 1 and 7 of 8 in turn)."""
        key = entry.step.batch_key
        running = next((b for b in self.running if b.items[0][1].batch_key == key), None)
        if running is None or len(running.items) >= stream.voice.max_batch(entry.step.kind):
            return False
        cost = self.costs.estimator(stream.voice.cost_key)
        rows, kind, unit = len(running.items), entry.step.kind, entry.step.size
        one, more = cost(kind, unit), cost(kind, (rows + 1) * unit) - cost(kind, rows * unit)
        if one <= 0 or more * 2 >= one:
            return False
        ends_at = running.started_at + running.estimate_s
        if ends_at - now > entry.step_s:
            return False
        # Only a stream that repeats its last call's kind (decoding) waits: the call in flight may be one that does
        # not come again (another stream's prefill).
        if self._last_keys.get(stream.id) != key:
            return False
        return entry.due_at is None or ends_at + safety * entry.to_audio_s <= entry.due_at

    @staticmethod
    def _splits(cost: CostEstimate, kind: str, unit: int, whole: int, share: int, slots: int) -> bool:
        """Whether ``whole`` steps (of about ``unit`` each) go into calls of ``share`` on ``slots`` free slots rather
        than one call: when the time that saves the batch is more than the slot time it takes from other work,
        ``cost(whole) - cost(share) > slots x cost(share) - cost(whole)``. A CPU's calls cost their rows' sum and split;
        a GPU's batch costs about one row and stays whole. Unmeasured, it splits."""
        if share >= whole:
            return False
        whole_s, share_s = cost(kind, whole * unit), cost(kind, share * unit)
        return whole_s <= 0 or 2 * whole_s > (slots + 1) * share_s

    def _ready_steps(self, stream: SpeechStream, safety: float) -> list[tuple[Lane, float, Step, float]]:
        """The steps ``stream`` may start now, one per free lane: (lane, call s, step, s to its audio). The main
        lane's is its smallest next step; the concurrent lane's is never of the kind in flight on the other."""
        busy = self._busy.get(stream.id, {})
        steps: list[tuple[Lane, float, Step, float]] = []
        cost = self.costs.estimator(stream.voice.cost_key)
        if "main" not in busy:
            smallest = smallest_step(stream, cost, safety)
            if smallest is not None and smallest.step.kind not in busy.values():
                steps.append(("main", smallest.step_s, smallest.step, smallest.to_audio_s))
        if "concurrent" not in busy:
            step = stream.session.concurrent_step()
            taken = {other.kind for _, _, other, _ in steps} | set(busy.values())
            if step is not None and step.kind not in taken:
                step_s = cost(step.kind, step.size)
                # First: where the policy ties the two (a stream owing first audio), the step that makes audio.
                steps.insert(0, ("concurrent", step_s, step, step_s))
        return steps

    def mean_batch_size(self, kind: str) -> float:
        """Streams per call of ``kind`` over its last ``RECENT_CALLS`` calls; 0 before the first."""
        sizes = self._recent_sizes.get(kind)
        return sum(sizes) / len(sizes) if sizes else 0.0

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
        for (stream, step), lane in zip(batch.items, batch.lanes, strict=True):
            self._busy.setdefault(stream.id, {})[lane] = step.kind
            if lane == "main":
                self._last_keys[stream.id] = step.batch_key
        self.decisions.append(Decision(batch.kind, tuple(stream.id for stream, _ in batch.items)))
        self._recent_sizes.setdefault(batch.kind, deque(maxlen=RECENT_CALLS)).append(len(batch.items))
        self.metrics.mean_batch_size.labels(batch.kind).set(self.mean_batch_size(batch.kind))
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
        for (stream, _), lane in zip(batch.items, batch.lanes, strict=True):
            busy = self._busy.get(stream.id, {})
            busy.pop(lane, None)
            if not busy:
                self._busy.pop(stream.id, None)

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
