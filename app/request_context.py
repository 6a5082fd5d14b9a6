"""Every request's id, its access log line and its count in the metrics: one ASGI middleware, outermost.

The id comes from the client's ``X-Request-ID`` when it is well formed (1 to 128 characters of letters, digits
and ``._:-``), else the server makes one (``req_`` and 32 hex digits). It goes back in the response's
``X-Request-ID`` header (on a WebSocket's handshake too), into ``error.request_id`` of every error body, and at
the end of every log line written while the request runs. When the request ends, one access line gives the
client, the request line (an ``api_key`` query value shown as ``***``), the status, the route, the key's name,
the time to first audio and the seconds of audio sent; and the metrics count it by transport, route and status, with
the time to first audio of each stream it opened.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rtvoice.app.metrics import RequestMetrics, Transport
from rtvoice.engine.stream import SpeechStream

access_log = logging.getLogger("rtvoice.access")

HEADER = "X-Request-ID"
VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Polled every few seconds by orchestrators: counted in the metrics, kept out of the access log."""
SECRET_QUERY_PARAMETERS = frozenset({"api_key"})


@dataclass
class RequestRecord:
    """What the access line says about one request; transports add the streams they open."""

    request_id: str
    started_at: float = field(default_factory=time.monotonic)
    key_name: str | None = None
    streams: list[SpeechStream] = field(default_factory=list)

    def ttfa_ms(self) -> float | None:
        """From the request's arrival to its first audio (the first stream that had any)."""
        first = [s.first_audio_at for s in self.streams if s.first_audio_at is not None]
        return round((min(first) - self.started_at) * 1000, 1) if first else None

    def audio_s(self) -> float:
        return round(sum(stream.emitted_s for stream in self.streams), 3)


_current: ContextVar[RequestRecord | None] = ContextVar("rtvoice_request", default=None)


def current() -> RequestRecord | None:
    """The record of the request this code runs for (tasks it started included); None outside requests."""
    return _current.get()


def current_request_id() -> str | None:
    record = _current.get()
    return record.request_id if record is not None else None


def track_stream(stream: SpeechStream) -> None:
    """Count ``stream`` in the current request's access line (TTFA, audio seconds)."""
    record = _current.get()
    if record is not None:
        record.streams.append(stream)


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's id when it is well formed, else a new one."""
    for name, value in headers:
        if name == b"x-request-id":
            return valid_or_new_id(value.decode("latin-1"))
    return valid_or_new_id(None)


def valid_or_new_id(given: str | None) -> str:
    return given if given is not None and VALID_ID.fullmatch(given) else f"req_{uuid.uuid4().hex}"


def redacted_query(query_string: bytes) -> str:
    if not query_string:
        return ""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    return "?" + urlencode([(k, "***" if k in SECRET_QUERY_PARAMETERS else v) for k, v in pairs], safe="*/:")


class RequestIdFilter(logging.Filter):
    """Adds `` request_id=...`` to lines written while a request runs (``%(request_suffix)s`` in the format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_id()
        record.request_suffix = f" request_id={request_id}" if request_id and record.name != access_log.name else ""
        return True


class RequestContext:
    """Outermost middleware: the request's id and record, its access line, its count by route and status."""

    def __init__(self, app: ASGIApp, metrics: RequestMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id_from(scope.get("headers", [])))
        _current.set(record)  # each connection's request runs in its own task: no reset needed
        scope.setdefault("state", {})["request"] = record
        websocket = scope["type"] == "websocket"
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind in ("http.response.start", "websocket.http.response.start"):
                status = message["status"]
                MutableHeaders(scope=message)[HEADER] = record.request_id
            elif kind == "websocket.accept":
                status = 101
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (HEADER.lower().encode(), record.request_id.encode())],
                }
            elif kind == "websocket.close" and websocket and status == 500:
                status = 403  # closed before the handshake: uvicorn answers 403
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None)
            transport: Transport = "websocket" if websocket else "http"
            if not websocket or status != 101:  # accepted WebSockets count themselves once their engine is ready
                label = route or ("static" if status < 400 else "other")
                self.metrics.count(transport, label, str(status))
            self.metrics.streams_ended(transport, record.streams)
            if scope["path"] not in PROBE_PATHS:
                self._log(scope, record, status, route)

    @staticmethod
    def _log(scope: Scope, record: RequestRecord, status: int, route: str | None) -> None:
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        if scope["type"] == "websocket":
            line = f"WebSocket {scope['path']}{redacted_query(scope.get('query_string', b''))}"
        else:
            line = (
                f"{scope['method']} {scope['path']}{redacted_query(scope.get('query_string', b''))} "
                f"HTTP/{scope.get('http_version', '1.1')}"
            )
        log_access(where, line, status, route, record)


def log_access(client: str, line: str, status: int | str, route: str | None, record: RequestRecord) -> None:
    """The one access line: client, request, status, route, key name, time to first audio, audio seconds, id."""
    ttfa = record.ttfa_ms()
    access_log.info(
        '%s "%s" %s route=%s key=%s ttfa_ms=%s audio_s=%s request_id=%s',
        client,
        line,
        status,
        route or "-",
        record.key_name or "-",
        "-" if ttfa is None else ttfa,
        record.audio_s(),
        record.request_id,
    )


def begin(request_id: str) -> RequestRecord:
    """A record for a request that did not come through the ASGI middleware (gRPC, Wyoming), current from now on."""
    record = RequestRecord(request_id)
    _current.set(record)
    return record
