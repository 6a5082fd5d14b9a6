"""WHEP's counters in the engine's Prometheus registry: sessions created and closed, utterances by outcome, late
and underrun frames, time to the first frame. The endpoint makes one; sessions and their playback queues count
into it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from rtvoice.app.whep.mediastreams import FRAME_S
from rtvoice.app.whep.playback_queue import QueuedUtterance
from rtvoice.engine.metrics import LATENCY_BUCKETS


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
