"""API keys and per-key quotas, for every HTTP route and WebSocket, as one ASGI middleware.

Keys come from ``RTVOICE_API_KEYS`` (comma-separated; ``name:key`` names a key, else it is ``key-1``,
``key-2``, ... by position). The name labels metrics and access lines; the key itself is never logged or
exported. A request presents its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; a WebSocket
may also use the query parameter ``api_key`` (browsers cannot set headers there). Every configured key is
compared, each in constant time (``hmac.compare_digest``), so the time taken tells nothing about which one,
if any, came close.

Open without a key: ``/healthz``, ``/readyz``, ``/v1/info``, the demo page, its files and favicon, the API docs,
CORS preflights, and ``/metrics`` unless ``RTVOICE_METRICS_REQUIRE_KEY``. The deprecated ``RTVOICE_WHEP_TOKEN`` is
one more key, named ``whep-token``, that opens the WHEP routes only (as it did); alone, it leaves the other routes
open.

Quotas hold per key: ``RTVOICE_KEY_REQUESTS_PER_MINUTE`` (a token bucket: that many at once, refilled evenly
over a minute) and ``RTVOICE_KEY_MAX_STREAMS`` (requests in flight, WebSocket connections and WHEP sessions).
Past either, 429 with ``Retry-After``. Without keys there are no quotas (capacity admission still holds).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from rtvoice.app.errors import HttpError, asgi_error, http_status
from rtvoice.app.request_context import RequestRecord
from rtvoice.app.settings import Settings
from rtvoice.engine.errors import EngineError

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset(
    {"/healthz", "/readyz", "/", "/favicon.ico", "/v1/info", "/docs", "/docs/oauth2-redirect", "/openapi.json"}
)
OPEN_PREFIXES = ("/web/", "/static-offline-docs/")
WHEP_PREFIXES = ("/whep", "/debug/whep")
WHEP_TOKEN_NAME = "whep-token"


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: bytes = field(repr=False)
    whep_only: bool = False
    """The deprecated WHEP token: valid on the WHEP routes only."""


def parse_api_keys(text: str) -> list[ApiKey]:
    """``RTVOICE_API_KEYS``: ``key`` or ``name:key`` items, comma-separated; ValueError for duplicates."""
    keys: list[ApiKey] = []
    for position, item in enumerate(filter(None, (part.strip() for part in text.split(","))), 1):
        name, separator, secret = item.partition(":")
        if not separator:
            name, secret = f"key-{position}", item
        name, secret = name.strip(), secret.strip()
        if not name or not secret:
            raise ValueError(f"RTVOICE_API_KEYS: item {position} has an empty name or key")
        keys.append(ApiKey(name, secret.encode()))
    names = [key.name for key in keys]
    if len(set(names)) != len(names):
        raise ValueError("RTVOICE_API_KEYS: two keys have the same name")
    if len({key.secret for key in keys}) != len(keys):
        raise ValueError("RTVOICE_API_KEYS: the same key is listed twice")
    return keys


def is_whep_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in WHEP_PREFIXES)


class KeyRing:
    def __init__(self, keys: list[ApiKey], metrics_require_key: bool = False) -> None:
        self.keys = keys
        self.metrics_require_key = metrics_require_key
        self.general = any(not key.whep_only for key in keys)
        self.whep = any(key.whep_only for key in keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        keys = parse_api_keys(settings.api_keys)
        if settings.whep_token:
            keys.append(ApiKey(WHEP_TOKEN_NAME, settings.whep_token.encode(), whep_only=True))
        return cls(keys, settings.metrics_require_key)

    def required(self, path: str, method: str) -> bool:
        if method == "OPTIONS" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return False
        if path == "/metrics" and not self.metrics_require_key:
            return False
        return self.general or (self.whep and is_whep_path(path))

    def match(self, presented: str, path: str) -> ApiKey | None:
        """The key ``presented`` is, compared with every key in constant time; None when it is none of them."""
        given = presented.encode()
        found = None
        for key in self.keys:
            if hmac.compare_digest(given, key.secret) and found is None:
                found = key
        if found is not None and found.whep_only and not is_whep_path(path):
            return None
        return found


def presented_key(connection: HTTPConnection) -> str | None:
    """``Authorization: Bearer``, then ``X-API-Key``, then (WebSockets only) the ``api_key`` query parameter."""
    scheme, _, value = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if connection.headers.get("x-api-key"):
        return connection.headers["x-api-key"].strip()
    if connection.scope["type"] == "websocket":
        for name, value in parse_qsl(connection.scope.get("query_string", b"").decode("latin-1")):
            if name == "api_key" and value:
                return value
    return None


class Unauthorized(HttpError):
    status = 401
    type = "authentication_error"


class QuotaExceeded(HttpError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="quota_exceeded")
        self.retry_after_s = retry_after_s


# -- quotas --------------------------------------------------------------------------------------------


class RequestRate:
    """Requests per minute per key: a token bucket holding ``per_minute``, refilled at ``per_minute / 60`` a second."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """key name -> (tokens, when counted)"""

    def take(self, name: str) -> float | None:
        """Take one request; None when allowed, else the seconds until one would be."""
        if self.per_minute <= 0:
            return None
        now = self.clock()
        tokens, then = self._buckets.get(name, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - then) * self.per_minute / 60)
        if tokens >= 1:
            self._buckets[name] = (tokens - 1, now)
            return None
        self._buckets[name] = (tokens, now)
        return (1 - tokens) * 60 / self.per_minute


class Lease:
    """One of a key's concurrent streams; ``release`` gives it back (once)."""

    def __init__(self, streams: StreamCount, name: str) -> None:
        self._streams = streams
        self.name = name
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._streams.give_back(self.name)


class StreamCount:
    """Concurrent streams per key."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.gauge = gauge
        self.held: dict[str, int] = {}

    def take(self, name: str) -> Lease | None:
        if self.limit > 0 and self.held.get(name, 0) >= self.limit:
            return None
        self.held[name] = self.held.get(name, 0) + 1
        self.gauge.labels(name).inc()
        return Lease(self, name)

    def give_back(self, name: str) -> None:
        self.held[name] -= 1
        self.gauge.labels(name).dec()


@dataclass
class Grant:
    """What a keyed request holds: its key's name and its stream lease (a WHEP session may keep the lease)."""

    key: ApiKey
    lease: Lease
    kept: bool = False

    def keep_lease(self) -> Lease:
        """The request's lease, kept past the request (a WHEP session's); the caller releases it."""
        self.kept = True
        return self.lease


def grant_of(connection: HTTPConnection) -> Grant | None:
    """The key and lease the middleware granted this request; None on an open server."""
    state = connection.scope.get("state", {})
    grant: Grant | None = state.get("grant")
    return grant


class AccessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rtvoice_key_requests", "Requests and WebSocket connections by API key name", ["key"], registry=registry
        )
        self.streams = Gauge(
            "rtvoice_key_streams",
            "Requests in flight, WebSockets and WHEP sessions by key name",
            ["key"],
            registry=registry,
        )
        self.rejected = Counter(
            "rtvoice_key_rejected",
            "Requests refused by a key's quota, by key name and quota",
            ["key", "quota"],
            registry=registry,
        )
        self.denied = Counter(
            "rtvoice_auth_denied", "Requests refused for a missing or wrong key", ["reason"], registry=registry
        )


class Access:
    """The keys, each key's quotas and their metrics: one per application, shared by every transport (the ASGI
    middleware below and the gRPC service's interceptor), so a key's quotas hold across all of them."""

    def __init__(
        self,
        keys: KeyRing,
        settings: Settings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = keys
        self.metrics = AccessMetrics(registry)
        self.rate = RequestRate(settings.key_requests_per_minute, clock)
        self.streams = StreamCount(settings.key_max_streams, self.metrics.streams)

    def admit(self, presented: str | None, path: str, websocket: bool = False) -> Grant:
        """The key ``presented`` and a stream lease; Unauthorized or QuotaExceeded otherwise."""
        key = self.keys.match(presented, path) if presented else None
        if key is None:
            self.metrics.denied.labels("missing" if presented is None else "invalid").inc()
            if presented is not None:
                raise Unauthorized("the API key is not valid", code="invalid_api_key")
            raise Unauthorized(
                "an API key is required: send it as 'Authorization: Bearer <key>' or 'X-API-Key: "
                "<key>'" + (" (or ?api_key=<key> on a WebSocket)" if websocket else ""),
                code="missing_api_key",
            )
        self.metrics.requests.labels(key.name).inc()
        wait_s = self.rate.take(key.name)
        if wait_s is not None:
            self.metrics.rejected.labels(key.name, "requests_per_minute").inc()
            raise QuotaExceeded(
                f"key {key.name!r} is over its {self.rate.per_minute} requests per minute", math.ceil(wait_s)
            )
        lease = self.streams.take(key.name)
        if lease is None:
            self.metrics.rejected.labels(key.name, "streams").inc()
            raise QuotaExceeded(
                f"key {key.name!r} already has {self.streams.limit} streams open (requests, "
                "WebSockets, WHEP sessions); retry when one ends",
                1,
            )
        return Grant(key, lease)


class AccessControl:
    """401 without a valid key where one is needed; 429 past the key's quotas; the key's name on the record."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.access.keys.required(
            scope["path"], scope.get("method", "GET")
        ):
            await self.app(scope, receive, send)
            return
        try:
            grant = self.access.admit(
                presented_key(HTTPConnection(scope)), scope["path"], websocket=scope["type"] == "websocket"
            )
        except EngineError as error:
            headers = {"WWW-Authenticate": 'Bearer realm="rtvoice"'} if http_status(error).status == 401 else None
            await asgi_error(scope, send, error, headers)
            return
        record: RequestRecord | None = scope.get("state", {}).get("request")
        if record is not None:
            record.key_name = grant.key.name
        scope.setdefault("state", {})["grant"] = grant
        try:
            await self.app(scope, receive, send)
        finally:
            if not grant.kept:
                grant.lease.release()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def warn_if_open(settings: Settings, keys: KeyRing) -> None:
    """Start-up warning: no keys and a listening address beyond loopback."""
    if not keys.general and not is_loopback(settings.host):
        log.warning(
            "RTVOICE_API_KEYS is empty and the server listens on %s: anyone who reaches the port can "
            "synthesise and register or delete voices; set RTVOICE_API_KEYS",
            settings.host,
        )
    if keys.whep:
        log.warning(
            "RTVOICE_WHEP_TOKEN is deprecated: it works as an API key for the WHEP routes only; put the "
            "token in RTVOICE_API_KEYS instead"
        )
