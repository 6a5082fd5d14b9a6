"""Prometheus metrics of one engine, in a registry of its own (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0)
QUEUE_WAIT_BUCKETS = (*LATENCY_BUCKETS, 10.0, 30.0, 60.0)
"""Past capacity, newcomers wait seconds to minutes (Retry-After is capped at a minute)."""
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttfa = Histogram(
            "rtvoice_time_to_first_audio_seconds",
            "Time from a stream's text to its first audio",
            ["voice"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.real_time_factor = Histogram(
            "rtvoice_real_time_factor",
            "Model compute seconds per second of audio, per finished stream",
            ["voice"],
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.audio_seconds = Counter("rtvoice_audio_seconds", "Seconds of audio produced", ["voice"], registry=r)
        self.active_streams = Gauge("rtvoice_active_streams", "Streams being synthesised", registry=r)
        self.queued_streams = Gauge("rtvoice_queued_streams", "Streams waiting for a synthesis slot", registry=r)
        self.queue_wait = Histogram(
            "rtvoice_queue_wait_seconds",
            "Time a stream waited in the admission queue (0 when admitted at once)",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.capacity = Gauge(
            "rtvoice_capacity_audio_seconds_per_second",
            "Audio seconds per second this machine makes with a voice, from measured model-call costs",
            ["voice"],
            registry=r,
        )
        self.demand = Gauge(
            "rtvoice_demand_audio_seconds_per_second",
            "Audio seconds per second admitted streams need: one per stream with synthesis left",
            registry=r,
        )
        self.load = Gauge(
            "rtvoice_load",
            "Demand over capacity (1 is all of it); new streams queue past RTVOICE_MAX_LOAD",
            registry=r,
        )
        self.mean_batch_size = Gauge(
            "rtvoice_mean_batch_size",
            'Steps per model call over the recent calls of each kind (CosyVoice2\'s mean LM batch: kind="lm")',
            ["kind"],
            registry=r,
        )
        self.batch_size = Histogram(
            "rtvoice_batch_size", "Steps per model call", ["kind"], buckets=BATCH_BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            "rtvoice_model_call_seconds",
            "Duration of one model call",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.wide_calls = Counter(
            "rtvoice_wide_model_calls",
            "Model calls that held every runner slot to run on all its cores (a lone "
            "stream's calls before its first audio)",
            ["kind"],
            registry=r,
        )
        self.calls_abandoned = Counter(
            "rtvoice_model_calls_abandoned",
            "Model calls abandoned past their deadline (their streams failed)",
            ["kind"],
            registry=r,
        )
        self.calls_running = Gauge(
            "rtvoice_model_calls_running",
            "Model calls holding a runner slot (abandoned calls hold none)",
            registry=r,
        )
        self.abandoned_threads = Gauge(
            "rtvoice_runner_abandoned_threads",
            "Runner threads still held by an abandoned (hung) model call",
            registry=r,
        )
        self.late_chunks = Counter(
            "rtvoice_late_chunks",
            "Chunks produced after a real-time listener would have run out of audio",
            registry=r,
        )
        self.stall_seconds = Counter(
            "rtvoice_stall_seconds", "Seconds a real-time listener would have waited for late chunks", registry=r
        )
        self.streams = Counter("rtvoice_streams", "Streams by outcome", ["outcome"], registry=r)
        self.rejected = Counter("rtvoice_rejected_streams", "Streams refused at admission", registry=r)
