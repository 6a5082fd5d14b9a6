"""Costs learned where the engine runs: seconds per model call, and compute per second of audio.

Every call the runner makes is timed, and its time feeds a fit per cost key (the voice's weights)
and step kind: ``seconds ≈ fixed + per_unit × size``, by least squares in which recent calls weigh
most, so the fit follows the machine as its speed or load changes. The engine seeds the fits with
timed warm-up calls, so the first request already has estimates. The real-time factor (compute
seconds per second of audio) of each key is tracked the same way; with the number of runner slots
it gives the capacity admission compares demand with.

Nothing here knows a machine's speed: every number comes from measured calls.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from rtvoice.engine.models.base import CostEstimate

SURPRISES_KEPT = 64
"""Recent calls whose actual-to-estimated time ratio sets how far estimates are trusted."""
SURPRISE_QUANTILE = 0.9
TAIL_SURPRISES_KEPT = 256
"""Recent calls whose ratios set the tail of the overruns: seconds of calls under load, so that the rare call that
runs two or three times its estimate (the machine stalls both slots at once) is among them."""
TAIL_SURPRISE_QUANTILE = 0.98
CALL_HALF_LIFE = 16
"""A call's weight in its fit halves after this many later calls of the same kind."""
AUDIO_HALF_LIFE_S = 60.0
"""A real-time factor's memory: the weight of past work halves with every this many seconds of audio made."""
HOLDS_KEPT = 256
"""Recent calls of a cost key (the calibration's largest steps among them at first) whose longest hold of a
runner slot sets how long any call of the key may plausibly take: the floor of a call's deadline."""


@dataclass
class LinearFit:
    """Recency-weighted least squares of ``y ≈ a + b x`` with a, b ≥ 0."""

    half_life: float = CALL_HALF_LIFE
    w: float = 0.0
    wx: float = 0.0
    wy: float = 0.0
    wxx: float = 0.0
    wxy: float = 0.0
    observations: int = 0
    _coefficients: tuple[float, float] | None = field(default=None, repr=False, compare=False)
    """Fixed part and slope, worked out once per observation: the planner asks for thousands of predictions
    between two calls."""

    def observe(self, x: float, y: float) -> None:
        self._coefficients = None
        keep = 0.5 ** (1 / self.half_life)
        self.w = self.w * keep + 1
        self.wx = self.wx * keep + x
        self.wy = self.wy * keep + y
        self.wxx = self.wxx * keep + x * x
        self.wxy = self.wxy * keep + x * y
        self.observations += 1

    def coefficients(self) -> tuple[float, float]:
        if self._coefficients is None:
            self._coefficients = self._fit()
        return self._coefficients

    def _fit(self) -> tuple[float, float]:
        mean_x, mean_y = self.wx / self.w, self.wy / self.w
        var_x = self.wxx / self.w - mean_x * mean_x
        if var_x > (0.05 * mean_x) ** 2:  # sizes spread enough to tell the fixed part from the slope
            slope = (self.wxy / self.w - mean_x * mean_y) / var_x
            fixed = mean_y - slope * mean_x
            if fixed >= 0 and slope >= 0:
                return fixed, slope
            if slope < 0:
                return mean_y, 0.0
        if mean_x <= 0:
            return mean_y, 0.0
        # One size seen (or a negative fixed part): proportional through the origin.
        return 0.0, self.wxy / self.wxx

    def predict(self, x: float) -> float:
        fixed, slope = self.coefficients()
        return fixed + slope * x


@dataclass
class RatioFit:
    """Compute seconds per second of audio, forgetting by audio made."""

    compute_s: float = 0.0
    audio_s: float = 0.0

    def observe(self, compute_s: float, audio_s: float) -> None:
        keep = 0.5 ** (audio_s / AUDIO_HALF_LIFE_S)
        self.compute_s = self.compute_s * keep + compute_s
        self.audio_s = self.audio_s * keep + audio_s

    @property
    def value(self) -> float | None:
        return self.compute_s / self.audio_s if self.audio_s > 0 else None


def _quantile(ratios: list[float], q: float, least: int) -> float:
    """The ``q`` quantile of actual-to-estimated ratios, at least 1; 1 with fewer than ``least`` of them."""
    if len(ratios) < least:
        return 1.0
    ordered = sorted(ratios)
    return max(1.0, ordered[int(q * (len(ordered) - 1))])


_serials = itertools.count()
"""Each CostModel's number: estimators of two models are never equal (an ``id`` may be reused)."""


@dataclass(frozen=True)
class Estimator:
    """``CostModel.call_s`` for one cost key, at one version of its fits."""

    model: CostModel = field(compare=False, hash=False)
    key: Hashable
    all_slots_busy: bool
    version: int
    serial: int
    """The model's number."""

    def __call__(self, kind: str, size: int) -> float:
        return self.model.call_s(self.key, kind, size, self.all_slots_busy)


class CostModel:
    def __init__(self) -> None:
        self._calls: dict[tuple[Hashable, str], LinearFit] = {}
        self._busy_calls: dict[tuple[Hashable, str], LinearFit] = {}
        """The same, from calls made while every runner slot was busy: what the machine does at full load."""
        self._rtf: dict[Hashable, RatioFit] = {}
        self._surprises: deque[float] = deque(maxlen=TAIL_SURPRISES_KEPT)
        self._overruns: tuple[float, float] | None = None
        """``surprise`` and ``tail_surprise``, worked out once per new ratio: every pick asks for them."""
        self._holds_s: dict[Hashable, deque[float]] = {}
        self._versions: dict[Hashable, int] = {}
        """Calls measured so far per cost key: the version of its estimates."""
        self._serial = next(_serials)

    def observe_call(
        self,
        key: Hashable,
        kind: str,
        size: int,
        seconds: float,
        all_slots_busy: bool = False,
        overrun_counts: bool = True,
    ) -> None:
        """One timed call; ``all_slots_busy`` when every runner slot held a call while it ran. ``overrun_counts``
        False: how far it ran past its estimate says how far the fit still is from the sizes it is being taught
        (the calibration's smallest, then largest steps), not how the machine wavers; it is not an overrun."""
        self._versions[key] = self._versions.get(key, 0) + 1
        fit = self._calls.setdefault((key, kind), LinearFit())
        if fit.observations and overrun_counts:
            predicted = fit.predict(float(size))
            if predicted > 0:
                self._surprises.append(seconds / predicted)
                self._overruns = None
        fit.observe(float(size), seconds)
        if all_slots_busy:
            self._busy_calls.setdefault((key, kind), LinearFit()).observe(float(size), seconds)

    def surprise(self) -> float:
        """How much longer than estimated calls have lately taken: the 90th percentile of the actual-to-estimated
        ratio over recent calls (1 when they keep to their estimates, more on a machine whose speed jumps)."""
        return self._overrun_quantiles()[0]

    def tail_surprise(self) -> float:
        """How much longer than estimated the slowest calls have lately taken: the 98th percentile of the same ratio
        over more calls (1 before as many as ``surprise`` keeps)."""
        return self._overrun_quantiles()[1]

    def _overrun_quantiles(self) -> tuple[float, float]:
        if self._overruns is None:
            ratios = list(self._surprises)
            self._overruns = (
                _quantile(ratios[-SURPRISES_KEPT:], SURPRISE_QUANTILE, SURPRISES_KEPT // 4),
                _quantile(ratios, TAIL_SURPRISE_QUANTILE, SURPRISES_KEPT),
            )
        return self._overruns

    def observe_hold(self, key: Hashable, seconds: float) -> None:
        """How long one call of the key held its runner slot as the event loop saw it: the call, and the wait for
        the loop to take its result (longer than the call when the loop or the machine is busy)."""
        self._holds_s.setdefault(key, deque(maxlen=HOLDS_KEPT)).append(seconds)

    def longest_hold_s(self, key: Hashable) -> float:
        """The longest hold among the key's recent calls, of any kind; 0 before any."""
        holds = self._holds_s.get(key)
        return max(holds) if holds else 0.0

    def measured(self, key: Hashable, kind: str) -> bool:
        """Calls of this kind have been timed for the key."""
        return (key, kind) in self._calls

    def call_s(self, key: Hashable, kind: str, size: int, all_slots_busy: bool = False) -> float:
        """Estimated seconds of one call, as calls go lately or (``all_slots_busy``) when every slot is busy, where
        cores shared by the slots, the event loop and other work make each call slower; 0 for a kind never
        measured."""
        fit = (self._busy_calls.get((key, kind)) if all_slots_busy else None) or self._calls.get((key, kind))
        return fit.predict(float(size)) if fit is not None else 0.0

    def estimator(self, key: Hashable, all_slots_busy: bool = False) -> CostEstimate:
        """The key's estimates as they stand: equal to another while no call of the key has been measured between
        them (what is worked out from one may be kept under it until then)."""
        return Estimator(self, key, all_slots_busy, self._versions.get(key, 0), self._serial)

    def observe_output(self, key: Hashable, compute_s: float, audio_s: float) -> None:
        self._rtf.setdefault(key, RatioFit()).observe(compute_s, audio_s)

    def real_time_factor(self, key: Hashable) -> float | None:
        """Compute seconds per second of audio made, lately; None before any audio."""
        fit = self._rtf.get(key)
        return fit.value if fit is not None else None
