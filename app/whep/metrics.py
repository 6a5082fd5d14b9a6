"""WHEP's counters in the engine's Prometheus registry: sessions created and closed, utterances by outcome, late
and underrun frames, time to the first frame, what players' receiver reports say (loss, jitter, round trip) and
how often a session's Opus encoder was replaced to follow them. The endpoint makes one; sessions and their
playback queues count into it. No metric has a per-session label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from rtvoice.app.whep.adaptation import ReceiverReport
from rtvoice.app.whep.mediastreams import FRAME_S
from rtvoice.app.whep.playback_queue import QueuedUtterance
from rtvoice.engine.metrics import LATENCY_BUCKETS

LOSS_BUCKETS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
"""Around the adaptation's thresholds (app/whep/adaptation.py: 3% and 10% up, 1.5% and 6% down)."""
JITTER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
ROUND_TRIP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


class WhepMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.created = Counter("rtvoice_whep_sessions_created", "WHEP sessions created", registry=registry)
        self.closed = Counter(
            "rtvoice_whep_sessions_closed", "WHEP sessions closed, by reason", ["reason"], registry=registry
        )
        self.utterances = Counter(
            "rtvoice_whep_utterances", "WHEP utterances by outcome", ["outcome"], registry=registry
        )
        self.late_frames = Counter(
            "rtvoice_whep_late_frames",
            "Audio frames pulled more than 60 ms after they were due (event loop behind)",
            registry=registry,
        )
        self.first_frame_seconds = Histogram(
            "rtvoice_whep_first_frame_seconds",
            "Text in (POST /speak or a DataChannel message) to its first frame handed to the RTP sender",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.underrun_seconds = Counter(
            "rtvoice_whep_underrun_seconds",
            "Silence sent inside an utterance because its audio was not ready",
            registry=registry,
        )

        self.reported_loss = Histogram(
            "rtvoice_whep_reported_loss_ratio",
            "Fraction of audio packets lost, per receiver report from a player (RTCP, about once a second)",
            buckets=LOSS_BUCKETS,
            registry=registry,
        )
        self.reported_jitter_seconds = Histogram(
            "rtvoice_whep_reported_jitter_seconds",
            "Interarrival jitter of the audio, per receiver report from a player",
            buckets=JITTER_BUCKETS,
            registry=registry,
        )
        self.round_trip_seconds = Histogram(
            "rtvoice_whep_round_trip_seconds",
            "Round-trip time to a player, per receiver report that allows its estimate",
            buckets=ROUND_TRIP_BUCKETS,
            registry=registry,
        )
        self.encoder_switches = Counter(
            "rtvoice_whep_encoder_switches",
            "Opus encoders replaced to change a session's bit rate or FEC loss hint (adaptation to reported loss)",
            registry=registry,
        )

    def observe_report(self, report: ReceiverReport) -> None:
        self.reported_loss.observe(report.fraction_lost)
        self.reported_jitter_seconds.observe(report.jitter_s)
        if report.round_trip_s is not None:
            self.round_trip_seconds.observe(report.round_trip_s)

    def count_late_frames(self, frames: int) -> None:
        self.late_frames.inc(frames)

    def count_underrun(self) -> None:
        self.underrun_seconds.inc(FRAME_S)

    def count_utterance(self, outcome: str) -> None:
        self.utterances.labels(outcome).inc()

    def observe_first_frame(self, utterance: QueuedUtterance) -> None:
        if utterance.first_frame_at is not None:
            source = "speak" if utterance.reply_to is None else "datachannel"
            self.first_frame_seconds.labels(source).observe(utterance.first_frame_at - utterance.accepted_at)
