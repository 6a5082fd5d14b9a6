"""What the ASGI middleware does for HTTP, for gRPC calls: request ids, API keys and quotas, the drain, the
access line. A ``grpc.aio`` server interceptor around each call of the service.

- ``x-request-id`` metadata is honoured when well formed, else one is made; it goes back as initial metadata,
  into ``rtvoice-request-id`` trailing metadata of an error, and into the log lines the call writes.
- The key comes as ``authorization: Bearer <key>`` or ``x-api-key`` metadata; a missing or wrong one ends the
  call with UNAUTHENTICATED; past a quota, RESOURCE_EXHAUSTED with ``retry-after``. The key's quotas are the
  same as on HTTP (one ``Access`` for the application).
- While the server drains, new calls end with UNAVAILABLE and ``retry-after``; calls in progress are waited for.
- When a call ends, the time to first audio of its stream goes into the metrics (``transport="grpc"``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from rtvoice.app.access import Access, Grant
from rtvoice.app.cosyvoice_grpc.status import status_of
from rtvoice.app.drain import Drain
from rtvoice.app.errors import ShuttingDown
from rtvoice.app.metrics import RequestMetrics
from rtvoice.app.request_context import begin, log_access, valid_or_new_id
from rtvoice.engine.errors import EngineError


def presented_key(metadata: dict[str, str]) -> str | None:
    scheme, _, value = metadata.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return metadata.get("x-api-key") or None


class Guard(grpc.aio.ServerInterceptor):
    def __init__(self, access: Access, drain: Drain, requests: RequestMetrics) -> None:
        self.access = access
        self.drain = drain
        self.requests = requests

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_stream is None:
            return handler
        method: str = details.method
        metadata = {key: value for key, value in (details.invocation_metadata or ()) if isinstance(value, str)}
        behavior = handler.unary_stream

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            record = begin(valid_or_new_id(metadata.get("x-request-id")))
            await context.send_initial_metadata((("x-request-id", record.request_id),))
            peer = context.peer() or "-"
            status = grpc.StatusCode.OK.name
            grant: Grant | None = None
            counted = False
            try:
                if self.drain.draining:
                    raise ShuttingDown()
                if self.access.keys.required(method, "POST"):
                    grant = self.access.admit(presented_key(metadata), method)
                    record.key_name = grant.key.name
                self.drain.requests_in_flight += 1
                counted = True
                async for response in behavior(request, context):
                    yield response
            except EngineError as error:
                code = status_of(error)
                status = code.name
                trailing: tuple[tuple[str, str], ...] = (
                    ("rtvoice-error-code", error.code),
                    ("rtvoice-request-id", record.request_id),
                )
                if error.retry_after_s is not None:
                    trailing += (("retry-after", str(error.retry_after_s)),)
                await context.abort(code, error.message, trailing_metadata=trailing)
            except BaseException:
                ended = context.code() if hasattr(context, "code") else None
                status = ended.name if isinstance(ended, grpc.StatusCode) else "CANCELLED"
                raise
            finally:
                if counted:
                    self.drain.requests_in_flight -= 1
                if grant is not None:
                    grant.lease.release()
                log_access(peer, f"gRPC {method}", status, method, record)
                self.requests.streams_ended("grpc", record.streams)

        return grpc.unary_stream_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
