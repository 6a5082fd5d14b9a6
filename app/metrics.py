"""The server's request counter, by route and status, in the engine's Prometheus registry (``/metrics`` shows
one registry). Every transport counts into it: the HTTP middleware, WebSockets once accepted, gRPC calls."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rtvoice_requests", "Requests by route and status", ["route", "status"], registry=registry
        )

    def count(self, route: str, status: str) -> None:
        self.requests.labels(route, status).inc()
