"""Admission: whether the runner slots can take one more stream without an admitted listener running out of audio.

Admission weighs what the admitted streams still need against what the runner slots make, both from costs measured
on this machine (``engine/capacity.py``): each stream needs its next steps before its listener runs out, then its
voice's compute per second of audio for the audio it has still to make (all of it while more text may come), and,
while it is starting, what its small first chunks cost beyond that (``Voice.start_cost``, spread over their audio).
A newcomer is admitted when ``max_load`` of the slots' time, over how far calls have lately overrun their estimates
(``CostModel.surprise``), serves all of them by those due times (``schedulable``: a stream far ahead of its
listener, or near its end, needs little), and fewer streams than runner slots are starting. The scheduler
(``engine/scheduler.py``) keeps the admitted and the queued streams and asks ``has_room`` for each newcomer and the
head of its queue, so admitted listeners never stall because of a newcomer; past its queue, ``Overloaded`` with a
Retry-After from the rate at which streams have been finishing (``retry_after_s``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from rtvoice.engine.capacity import VoiceRates, voice_rates
from rtvoice.engine.cost import CostModel
from rtvoice.engine.models.base import CostEstimate, Step, StepBudget, still_starting
from rtvoice.engine.stream import SpeechStream

DEPARTURES_KEPT = 32
"""Finished streams remembered for the rate at which places free up (Retry-After)."""


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


def has_room(
    newcomer: SpeechStream,
    playing: Sequence[SpeechStream],
    slots_free_at: list[float],
    costs: CostModel,
    max_load: float,
    safety: float,
    load: Callable[[], float],
) -> bool:
    """Whether ``newcomer`` may join the admitted streams with work left (``playing``): the runner slots, each free at
    its ``slots_free_at``, serve them all by their due times at ``max_load`` of their time, with the margin
    ``safety`` on estimates, and fewer streams than slots are starting at the machine's ``load`` (asked only then)."""
    rates: dict[Hashable, VoiceRates | None] = {}  # each voice's figures once per test, not per stream

    def need(stream: SpeechStream) -> Need | None:
        key = stream.voice.cost_key
        if key not in rates:
            rates[key] = voice_rates(costs, stream.voice)
        return _need(stream, rates[key], min(slots_free_at), safety)

    own = need(newcomer)
    needs = [need(stream) for stream in playing]
    measured = [n for n in needs if n is not None]
    if own is None or not needs or len(measured) < len(needs):
        return True  # nothing measured yet, or nothing else needs the machine: serve it
    # The share of the slots' time that may be spoken for shrinks by how far calls have lately overrun their
    # estimates: that much room is left for a slow spell, and the listeners' buffers are not spent on it.
    if not schedulable(own, measured, slots_free_at, max_load / costs.surprise()):
        return False
    # A start costs more than steady speech (first audio, then building a buffer): no more streams starting at once
    # than there are runner slots, so that those playing keep their buffers (docs/decisions.md).
    return _starting(playing, load()) < len(slots_free_at)


def _need(stream: SpeechStream, rates: VoiceRates | None, slot_free_at: float, safety: float) -> Need | None:
    """What ``stream`` needs of the runner slots from now on, at its voice's ``rates`` and the margin ``safety`` on
    estimates, when the first slot is free at ``slot_free_at``; None before any measurement."""
    if rates is None:
        return None
    remaining = stream.session.remaining_audio_s() if stream.input_closed else None
    if remaining is None:
        remaining = math.inf  # more text may come: it needs audio for as long as it lasts
    smallest = smallest_step(stream, rates.cost, safety)
    to_audio = smallest.to_audio_s if smallest is not None else 0.0
    due_at = stream.playback.runs_out_at
    if due_at is None:  # first audio: as soon as its steps can run, with the margin on estimates
        due_at = slot_free_at + safety * to_audio
    start = rates.start
    if start is None:
        return Need(to_audio, due_at, rates.per_audio_s, remaining)
    # The part of its start still ahead (by the audio it has made), with the margin on estimates, spread evenly over
    # its audio: counted where the ramp spends it (most on the first chunks), it kept newcomers waiting longer
    # (docs/decisions.md).
    start_left_s = max(0.0, min(start.audio_s - stream.playback.audio_s, remaining))
    start_extra_s = safety * start.extra_s * start_left_s / start.audio_s
    return Need(to_audio, due_at, rates.per_audio_s, remaining, start_extra_s, start_left_s)


@dataclass(frozen=True)
class SmallestStep:
    """A stream's smallest next step, as the policy and admission see it."""

    step: Step
    step_s: float
    """Estimated seconds of its call."""
    to_audio_s: float
    """Estimated seconds from its start to the stream's next audio."""


def smallest_step(stream: SpeechStream, cost: CostEstimate, safety: float) -> SmallestStep | None:
    """The least ``stream`` needs to run before new audio: its smallest next step (nothing fits a zero budget), with
    its call's and its time to audio (the steps that must follow it included) by ``cost``; None when it has no step
    to run."""
    budget = StepBudget(0.0, None if stream.playback.owes_first_audio else 0.0, cost, safety)
    step = stream.session.plan_step(budget)
    if step is None:
        return None
    step_s = cost(step.kind, step.size)
    return SmallestStep(step, step_s, step_s + sum(cost(kind, size) for kind, size in step.until_audio))


def _starting(streams: Sequence[SpeechStream], load: float) -> int:
    """How many of ``streams`` (those with work) are starting: they owe their first audio, or their listener's
    buffer, right after their last audio, held less than one round of the machine (the time it needs to serve every
    admitted stream once at its voice's largest step: ``load`` × that step's audio)."""
    return sum(1 for stream in streams if is_starting(stream, load))


def is_starting(stream: SpeechStream, load: float) -> bool:
    """``still_starting`` for ``stream``: it owes its first audio, or holds less than a round of the machine."""
    playback = stream.playback
    buffered = None if playback.owes_first_audio else playback.buffered_s
    return still_starting(buffered, load, stream.voice.largest_step_audio_s())


def retry_after_s(departures: Sequence[float], queued: int) -> int:
    """Seconds until a place is likely free: the ``queued`` streams ahead over the rate at which streams have
    finished (at the times ``departures``, oldest first)."""
    if len(departures) < 2:
        return 1
    span = departures[-1] - departures[0]
    if span <= 0:
        return 1
    rate = (len(departures) - 1) / span
    return max(1, min(60, math.ceil((queued + 1) / rate)))
