"""The server's request metrics, by transport, in the engine's Prometheus registry (``/metrics`` shows one registry).
Every transport counts into them: the HTTP middleware (``http``), WebSockets once accepted (``websocket``), gRPC calls
(``grpc``) and Wyoming requests (``wyoming``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

from rtvoice.engine.metrics import LATENCY_BUCKETS
from rtvoice.engine.stream import SpeechStream

Transport = Literal["http", "websocket", "grpc", "wyoming"]


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rtvoice_requests",
            "Requests by transport, route and status",
            ["transport", "route", "status"],
            registry=registry,
        )
        self.ttfa = Histogram(
            "rtvoice_request_time_to_first_audio_seconds",
            "Time from a stream's first text to its first audio, by the transport that opened it (counted when its "
            "request, or its WebSocket, ends)",
            ["transport"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def count(self, transport: Transport, route: str, status: str) -> None:
        self.requests.labels(transport, route, status).inc()

    def streams_ended(self, transport: Transport, streams: Iterable[SpeechStream]) -> None:
        """Each of a request's streams that had audio: its time to first audio."""
        for stream in streams:
            ttfa_s = stream.stats().ttfa_s
            if ttfa_s is not None:
                self.ttfa.labels(transport).observe(ttfa_s)
