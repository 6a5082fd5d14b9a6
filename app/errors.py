"""The one error body every route returns: OpenAI's ``{"error": {"message", "type", "code", "param"}}``,
with the request's id as ``request_id`` when it runs for a request; and the HTTP status and OpenAI type of each
error, the engine's included (the engine names what went wrong, not how a protocol says it)."""

from __future__ import annotations

import logging
from typing import NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope, Send

from rtvoice.app.close_codes import CLOSE_POLICY_VIOLATION, CLOSE_TRY_AGAIN_LATER
from rtvoice.app.request_context import current_request_id
from rtvoice.engine.errors import (
    Conflict,
    EngineError,
    InvalidRequest,
    ModelNotLoaded,
    Overloaded,
    StorageFailed,
    StreamFailed,
)

log = logging.getLogger(__name__)


class HttpStatus(NamedTuple):
    status: int
    type: str
    """OpenAI's error type."""


INVALID_REQUEST = HttpStatus(400, "invalid_request_error")

ENGINE_STATUSES: dict[type[EngineError], HttpStatus] = {
    Overloaded: HttpStatus(503, "server_overloaded"),
    # 404, like OpenAI's unknown model: the condition lasts as long as the server's settings, so a client must
    # not retry (a 503 would tell it to).
    ModelNotLoaded: HttpStatus(404, "invalid_request_error"),
    StreamFailed: HttpStatus(500, "server_error"),
    Conflict: HttpStatus(409, "invalid_request_error"),
    StorageFailed: HttpStatus(500, "server_error"),
}
"""The engine's errors by class (a subclass takes its nearest base's); any other is a 400."""


class HttpError(EngineError):
    """An error app/ raises itself (a missing resource, a conflict, a media type, a key, a quota, a limit, the
    drain): it names its status and OpenAI type, as Starlette's ``HTTPException`` does, and the one handler
    below renders it. Subclasses set ``status`` and ``type``; a one-off passes them."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        code: str = "invalid_request",
        param: str | None = None,
        *,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code, param)
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = headers or {}


def http_status(error: EngineError) -> HttpStatus:
    """The HTTP status and OpenAI error type of any rtvoice error."""
    if isinstance(error, HttpError):
        return HttpStatus(error.status, error.type)
    for kind in type(error).__mro__:
        if kind in ENGINE_STATUSES:
            return ENGINE_STATUSES[kind]
    return INVALID_REQUEST


def error_body(
    message: str, type: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    body: dict[str, str | None] = {"message": message, "type": type, "code": code, "param": param}
    request_id = current_request_id()
    if request_id is not None:
        body["request_id"] = request_id
    return {"error": body}


def engine_error_body(error: EngineError) -> dict[str, dict[str, str | None]]:
    return error_body(error.message, http_status(error).type, error.code, error.param)


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, code, param), status_code=status, headers=headers)


def engine_error_response(error: EngineError) -> JSONResponse:
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else {}
    if isinstance(error, HttpError):
        headers.update(error.headers)
    return JSONResponse(engine_error_body(error), status_code=http_status(error).status, headers=headers or None)


SHUTDOWN_RETRY_AFTER_S = 5
"""What a client refused by a draining server is told to wait: another instance should be taking traffic by then."""


class ShuttingDown(HttpError):
    """The one "server is shutting down" error: HTTP's 503, and each protocol's goodbye while the server drains."""

    status = 503
    type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "the server is shutting down; retry on another instance or shortly", code="server_shutting_down"
        )
        self.retry_after_s = SHUTDOWN_RETRY_AFTER_S


async def asgi_error(scope: Scope, send: Send, error: EngineError, headers: dict[str, str] | None = None) -> None:
    """Answer a request with the error body from a middleware, before any route runs.

    A WebSocket gets the same HTTP answer before its upgrade (ASGI's ``websocket.http.response``); a server
    without that extension gets a close instead: 1008 for 401/403, 1013 (try again later) for the rest.
    """
    response = engine_error_response(error)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if scope["type"] == "http":
        await response({**scope}, _no_receive, send)
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send(
            {"type": "websocket.http.response.start", "status": response.status_code, "headers": response.raw_headers}
        )
        await send({"type": "websocket.http.response.body", "body": response.body})
        return
    code = CLOSE_POLICY_VIOLATION if http_status(error).status in (401, 403) else CLOSE_TRY_AGAIN_LATER
    await send({"type": "websocket.close", "code": code, "reason": error.code[:120]})


async def _no_receive() -> dict[str, object]:
    return {"type": "http.disconnect"}


def error_fields(error: EngineError) -> dict[str, object]:
    """The fields of an ``error`` event on the real-time protocols (WebSocket, WHEP DataChannel)."""
    fields: dict[str, object] = {"code": error.code, "message": error.message, "param": error.param}
    if error.retry_after_s is not None:
        fields["retry_after_s"] = error.retry_after_s
    return fields


def invalid_value(error: ValidationError | RequestValidationError) -> InvalidRequest:
    """The first problem pydantic found, named by its field."""
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "form")]
    param = ".".join(location) or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"'{param}': {message}"
    return InvalidRequest(message, code="invalid_value", param=param)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 415: "unsupported_media_type"}


def install(app: FastAPI) -> None:
    """Route every failure through ``error_body``; nothing leaves as a bare 500."""

    @app.exception_handler(EngineError)
    async def _engine(_: Request, error: EngineError) -> JSONResponse:
        return engine_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, error: RequestValidationError) -> JSONResponse:
        return engine_error_response(invalid_value(error))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        type = "invalid_request_error" if error.status_code < 500 else "server_error"
        code = _HTTP_CODES.get(error.status_code, f"http_{error.status_code}")
        return error_response(error.status_code, str(error.detail), type, code, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal error", "server_error", "internal_error")
