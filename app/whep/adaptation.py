"""A session's audio follows its player's receiver reports: Opus bit rate, FEC loss hint and RED by loss bucket.

About once a second the session reads its sender's ``remote-inbound-rtp``
statistics, which aiortc fills from the player's RTCP receiver reports: the
fraction of packets lost since the last report, interarrival jitter, and the
round-trip time. The loss, smoothed, picks one of ``PROFILES``; moving to a
lossier profile happens on the report that crosses its threshold, moving back to
a cleaner one only after ``RECOVER_REPORTS`` reports in a row below a lower
threshold, so a link near a boundary does not make the encoder flap. Jitter and
RTT are measured and shown, not acted on: they size the player's jitter buffer,
and nothing the encoder can choose makes them smaller. A session whose player
sends no reports keeps the first profile. Why these buckets: docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rtvoice.engine.audio.encoding import OpusTuning

log = logging.getLogger(__name__)

RTP_CLOCK_RATE = 48_000
REPORT_INTERVAL_S = 1.0
SMOOTHING = 0.5
"""Weight of the newest report in the smoothed loss: a report covers only ~50 packets (one lost is 2%)."""
RECOVER_REPORTS = 3
"""Reports in a row below a profile's ``leave_loss`` before the session steps one profile cleaner."""
FRACTION_LOST_SCALE = 256
"""RTCP's fraction lost is a fixed-point fraction of 256 (RFC 3550 6.4.1); aiortc passes it on as is."""


@dataclass(frozen=True)
class LinkProfile:
    name: str
    enter_loss: float
    """Smoothed loss at or above which the session moves up to this profile."""
    leave_loss: float
    """Smoothed loss below which (for ``RECOVER_REPORTS`` reports) the session steps down from it."""
    bit_rate: int
    packet_loss_percent: int
    """libopus's expected loss (its in-band FEC grows with it)."""
    red: bool
    """RFC 2198 redundancy, where the player offered it."""


PROFILES = (
    LinkProfile("clean", 0.0, 0.0, 40_000, 5, red=False),
    LinkProfile("lossy", 0.03, 0.015, 32_000, 12, red=True),
    LinkProfile("heavy", 0.10, 0.06, 24_000, 25, red=True),
)


@dataclass(frozen=True)
class ReceiverReport:
    fraction_lost: float
    jitter_s: float
    round_trip_s: float | None


class LossBuckets:
    """The profile for a sequence of receiver reports: up at once, down one step after a calm run."""

    def __init__(self) -> None:
        self.index = 0
        self.loss = 0.0
        """The smoothed fraction lost."""
        self._calm = 0

    @property
    def profile(self) -> LinkProfile:
        return PROFILES[self.index]

    def observe(self, fraction_lost: float) -> LinkProfile | None:
        """Take one report's loss; the new profile when it changes, else None."""
        self.loss = SMOOTHING * fraction_lost + (1 - SMOOTHING) * self.loss
        worst = max(i for i, p in enumerate(PROFILES) if self.loss >= p.enter_loss)
        if worst > self.index:
            self.index, self._calm = worst, 0
            return self.profile
        if self.index > 0 and self.loss < self.profile.leave_loss:
            self._calm += 1
            if self._calm >= RECOVER_REPORTS:
                self.index, self._calm = self.index - 1, 0
                return self.profile
            return None
        self._calm = 0
        return None


def tuning_of(profile: LinkProfile, fec: bool) -> OpusTuning:
    return OpusTuning(profile.bit_rate, profile.packet_loss_percent, fec)


def report_of(stats: Any) -> tuple[datetime, ReceiverReport] | None:
    """The newest ``remote-inbound-rtp`` entry of an aiortc stats report, with its time; None before any."""
    for entry in stats.values():
        if getattr(entry, "type", None) == "remote-inbound-rtp":
            return entry.timestamp, ReceiverReport(
                fraction_lost=float(entry.fractionLost) / FRACTION_LOST_SCALE,
                jitter_s=float(entry.jitter) / RTP_CLOCK_RATE,
                round_trip_s=None if entry.roundTripTime is None else float(entry.roundTripTime),
            )
    return None


class LinkMonitor:
    """Reads a sender's receiver reports once a second and hands each new one, and each profile change, on."""

    def __init__(
        self,
        get_stats: Callable[[], Any],
        on_report: Callable[[ReceiverReport], None],
        on_profile: Callable[[LinkProfile, ReceiverReport, float], None],
    ) -> None:
        self._get_stats = get_stats
        self._on_report = on_report
        self._on_profile = on_profile
        self.buckets = LossBuckets()
        self.last_report: ReceiverReport | None = None
        self.reports = 0
        self._seen: datetime | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            try:
                stats = await self._get_stats()
            except Exception as error:  # a transport closing under us: the session's close ends this task
                log.debug("receiver reports not read: %s", error)
                continue
            self.poll(report_of(stats))

    def poll(self, found: tuple[datetime, ReceiverReport] | None) -> None:
        if found is None or found[0] == self._seen:
            return  # no report yet, or none since the last look
        self._seen, report = found
        self.last_report = report
        self.reports += 1
        self._on_report(report)
        changed = self.buckets.observe(report.fraction_lost)
        if changed is not None:
            self._on_profile(changed, report, self.buckets.loss)
