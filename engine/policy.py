"""Who goes next, and how long the next call may hold its runner slot, from measured costs.

Each ready stream is seen through its smallest next step: how long that call takes
(``step_s``) and how long until the stream has new audio once it starts (``to_audio_s``, the
steps that must follow included), both estimated from calls measured on this machine. A stream
whose listener runs out of audio at ``due_at`` must start by its latest start,
``due_at - safety × to_audio_s``.

Order:

0. streams that could not wait for the call that would otherwise go first (a stream owing first
   audio), by latest start: a gap in playing speech is audible;
1. streams owing their first audio, oldest first (time to first audio);
2. the others, by latest start.

Calls are not preemptive, so the head's call may hold its slot only as long as every other ready
stream can still start in time on some slot (``call_budget``): the listeners' buffers, the slots,
and the calls in flight decide it, not a constant.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rtvoice.engine.models.base import Step


@dataclass(frozen=True)
class Ready:
    """A stream with a step to run, as the policy sees it."""

    stream_id: int
    step: Step
    """Its smallest next step."""
    step_s: float
    """Estimated seconds of that step's call."""
    to_audio_s: float
    """Estimated seconds from starting that step to the stream's next audio."""
    due_at: float | None
    """When its listener runs out of audio; None while it owes its first audio."""
    since: float
    """When it began to owe its first audio (arrival, or new text after silence)."""
    own_safety: float = 0.0
    """The margin on its time to audio instead, when more than the common one: a stream still starting holds too
    little audio for one call that overruns like the slowest lately (``StepBudget.own_safety``)."""

    def latest_start(self, safety: float) -> float:
        assert self.due_at is not None
        return self.due_at - max(safety, self.own_safety) * self.to_audio_s


def order(ready: Sequence[Ready], now: float, safety: float) -> list[Ready]:
    """``ready`` most pressing first (tiers 0, 1, 2 above)."""
    first_audio = [r for r in ready if r.due_at is None]
    # What serving the oldest first-audio stream first would cost the others: its call's slot time.
    hold = safety * min(first_audio, key=lambda r: r.since).step_s if first_audio else math.inf

    def key(r: Ready) -> tuple[int, float]:
        if r.due_at is None:
            return (1, r.since)
        latest = r.latest_start(safety)
        return (0, latest) if latest - now < hold else (2, latest)

    return sorted(ready, key=key)


def call_budget(others: Sequence[Ready], now: float, other_slots_free_at: Sequence[float], safety: float) -> float:
    """Longest a call starting now may hold its slot so that each of ``others`` still starts in time.

    ``other_slots_free_at``: when each other runner slot is free (``now`` when idle; a call in flight
    frees its slot at its estimated end). Streams owing first audio must start once the smallest call
    would have ended (``safety`` × their own step's time from now); playing streams by their latest
    start. Returns ``math.inf`` when no call length can make anyone late.
    """
    deadlines: list[tuple[float, float]] = []  # (latest start, seconds it then holds a slot)
    for r in others:
        latest = now + safety * r.step_s if r.due_at is None else r.latest_start(safety)
        deadlines.append((latest, r.step_s * safety))
    if not deadlines:
        return math.inf
    deadlines.sort()

    def lateness(call_s: float) -> float:
        """How late the others start in all when this call holds its slot ``call_s`` (list scheduling)."""
        slots = [max(now, t) for t in other_slots_free_at] + [now + call_s]
        heapq.heapify(slots)
        late = 0.0
        for latest, hold in deadlines:
            start = heapq.heappop(slots)
            late += max(0.0, start - latest)
            heapq.heappush(slots, start + hold)
        return late

    # Streams already too late to save are late whatever runs; a longer call must not add to it.
    unavoidable = lateness(0.0) + 1e-6
    if lateness(math.inf) <= unavoidable:
        return math.inf
    low, high = 0.0, max(latest for latest, _ in deadlines) - now
    if high <= 0:
        return 0.0
    for _ in range(24):
        middle = (low + high) / 2
        if lateness(middle) <= unavoidable:
            low = middle
        else:
            high = middle
    return low
