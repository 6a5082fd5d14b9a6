"""rtvoice's errors as gRPC status codes (what the service ends a call with, and what the guard refuses one with)."""

from __future__ import annotations

import grpc

from rtvoice.app.errors import http_status
from rtvoice.engine.errors import EngineError, ModelNotLoaded, Overloaded, UnknownVoice


def status_of(error: EngineError) -> grpc.StatusCode:
    status = http_status(error).status
    if isinstance(error, Overloaded) or status == 429:  # capacity, or a key's quota
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if status == 401:
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(error, ModelNotLoaded):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, UnknownVoice):
        return grpc.StatusCode.NOT_FOUND
    if status == 503:
        return grpc.StatusCode.UNAVAILABLE
    if status >= 500:
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INVALID_ARGUMENT
