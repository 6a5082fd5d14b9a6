"""Errors the engine raises for bad requests and overload, typed by what went wrong; transports map them to their
protocol (HTTP statuses and OpenAI's error types in app/errors.py, gRPC codes in app/cosyvoice_grpc/status.py)."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine will not serve; ``code`` and ``param`` name the problem."""

    retry_after_s: int | None = None
    """Seconds after which the same request may succeed (overload); None when retrying will not help."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class InvalidRequest(EngineError):
    pass


class UnknownVoice(EngineError):
    def __init__(self, name: str, valid: list[str], param: str = "voice") -> None:
        super().__init__(
            f"unknown voice {name!r}; valid voices: {', '.join(valid)}", code="voice_not_found", param=param
        )


class Overloaded(EngineError):
    """The machine is at capacity: the same request may succeed after ``retry_after_s``."""

    def __init__(
        self,
        retry_after_s: int = 1,
        message: str = "the server is at capacity; retry shortly",
        code: str = "overloaded",
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class ModelNotLoaded(EngineError):
    """A request needs a model this server did not load (e.g. CosyVoice2 without RTVOICE_COSYVOICE_DIR): the
    condition lasts as long as the server's settings, so retrying will not help."""


class StreamFailed(EngineError):
    """A model call failed while the stream was being synthesised (the server's fault, not the request's)."""


class Conflict(EngineError):
    """The request clashes with what the server holds (a voice id taken, a voice that may not be deleted)."""


class StorageFailed(EngineError):
    """The server could not keep what the request asked it to keep (a registered voice's file)."""
