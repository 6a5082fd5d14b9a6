"""How rtvoice's errors become HTTP: the engine's typed errors by class (a subclass takes its base's), the ones
app/ raises itself by their own status, everything else a 400."""

from __future__ import annotations

import pytest

from rtvoice.app.drain import ShuttingDown
from rtvoice.app.errors import HttpError, HttpStatus, engine_error_response, http_status
from rtvoice.app.limits import TooManyWebSockets
from rtvoice.app.whep.endpoint import AtCapacity
from rtvoice.engine import errors as engine_errors
from rtvoice.engine.errors import EngineError, InvalidRequest, ModelNotLoaded, Overloaded, StreamFailed, UnknownVoice


@pytest.mark.parametrize(
    "error,expected",
    [
        (InvalidRequest("bad"), HttpStatus(400, "invalid_request_error")),
        (UnknownVoice("x", ["a"]), HttpStatus(400, "invalid_request_error")),
        (EngineError("closed", code="session_closed"), HttpStatus(400, "invalid_request_error")),
        (Overloaded(), HttpStatus(503, "server_overloaded")),
        (AtCapacity(4), HttpStatus(503, "server_overloaded")),  # subclasses take their base's
        (TooManyWebSockets(4), HttpStatus(503, "server_overloaded")),
        (ModelNotLoaded("no model"), HttpStatus(404, "invalid_request_error")),
        (StreamFailed("broke"), HttpStatus(500, "server_error")),
        (ShuttingDown(), HttpStatus(503, "server_error")),
        (HttpError("gone", status=404), HttpStatus(404, "invalid_request_error")),
        (HttpError("disk", status=500, type="server_error"), HttpStatus(500, "server_error")),
    ],
)
def test_statuses(error: EngineError, expected: HttpStatus) -> None:
    assert http_status(error) == expected


def test_the_engine_names_no_protocol() -> None:
    """The engine's errors carry a code, a message, a param and a retry time; statuses are app/'s."""
    for name in dir(engine_errors):
        kind = getattr(engine_errors, name)
        if isinstance(kind, type) and issubclass(kind, EngineError):
            assert not {"status", "type", "status_code"} & set(vars(kind)), name


def test_the_response_carries_retry_after_and_the_errors_own_headers() -> None:
    response = engine_error_response(
        HttpError("wrong type", code="unsupported_media_type", status=415, headers={"Accept-Post": "application/sdp"})
    )
    assert response.status_code == 415 and response.headers["accept-post"] == "application/sdp"
    overloaded = engine_error_response(Overloaded(retry_after_s=7))
    assert overloaded.status_code == 503 and overloaded.headers["retry-after"] == "7"
