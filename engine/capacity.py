"""What the runner slots make with each voice, from the costs measured on this machine, and the load on them.

``engine/cost.py`` learns what calls cost; this turns that into the figures admission and the chunk plan weigh:
a voice's compute per second of audio (and what a stream's start costs over it), the audio seconds per second the
slots make with it (capacity), and the share of that the admitted streams need (load). All of them as calls cost
while every runner slot is busy: where slots share cores, or other work shares them, each call is slower then.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from rtvoice.engine.cost import CostModel
from rtvoice.engine.models.base import CostEstimate, StartCost, Voice


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
class VoiceRates:
    """One voice's figures for admission, as measured calls cost while every runner slot is busy."""

    cost: CostEstimate
    per_audio_s: float
    """Compute seconds per second of audio at its steady step sizes."""
    start: StartCost | None
    """What a start costs over that (``Voice.start_cost``); None when the voice cannot tell."""


def voice_rates(costs: CostModel, voice: Voice) -> VoiceRates | None:
    """``voice``'s figures for admission, from ``costs`` as calls cost while every slot is busy; None before any
    measurement."""
    cost = costs.estimator(voice.cost_key, all_slots_busy=True)
    per_audio = voice.compute_per_audio_s(cost) or costs.real_time_factor(voice.cost_key)
    if not per_audio:
        return None
    start = voice.start_cost(cost)
    return VoiceRates(cost, per_audio, start if start is not None and start.audio_s > 0 else None)


def audio_per_s(costs: CostModel, slots: int, voice: Voice) -> float | None:
    """Audio seconds per second ``slots`` runner slots make with ``voice``; None before any measurement.

    From the voice's cost at its most efficient step sizes when it can tell (the plan reaches them under load), as
    calls cost while every runner slot is busy; else from the real-time factor measured on its recent work."""
    rtf = voice.compute_per_audio_s(costs.estimator(voice.cost_key, all_slots_busy=True))
    if rtf is None:
        rtf = costs.real_time_factor(voice.cost_key)
    return slots / rtf if rtf else None


def machine_load(costs: CostModel, slots: int, demand: Iterable[Voice], present: Iterable[Voice]) -> Load:
    """The load of streams with work left (the voice of each in ``demand``) on ``slots`` runner slots, with the
    capacity of every voice ``present`` (admitted or queued) that has been measured."""
    result = Load()
    for voice in demand:
        key = voice.cost_key
        result.demand[key] = result.demand.get(key, 0) + 1
    for voice in present:
        key = voice.cost_key
        if key not in result.capacity:
            capacity = audio_per_s(costs, slots, voice)
            if capacity is not None:
                result.capacity[key] = capacity
    return result
