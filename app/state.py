"""Where a request finds the engine: on the application, set up by the lifespan."""

from __future__ import annotations

from fastapi import Request
from starlette.requests import HTTPConnection

from rtvoice.app.errors import HttpError
from rtvoice.engine.engine import Engine


class NotReady(HttpError):
    status = 503
    type = "server_error"


def still_loading() -> NotReady:
    """What every transport answers before the engine's voices are loaded."""
    return NotReady("the server is still loading its voices", code="not_ready")


def engine_of(connection: Request | HTTPConnection) -> Engine:
    engine: Engine = connection.app.state.engine
    if not engine.ready:
        raise still_loading()
    return engine
