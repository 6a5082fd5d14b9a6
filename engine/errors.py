"""Errors the engine raises for bad requests and overload; transports map them to their protocol."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine will not serve; ``code`` and ``param`` name the problem."""

    status = 400
    type = "invalid_request_error"
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
    status = 503
    type = "server_overloaded"

    def __init__(self, retry_after_s: int = 1, message: str = "the server is at capacity; retry shortly",
                 code: str = "overloaded") -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class ModelNotLoaded(EngineError):
    """A route needs a model this server did not load (e.g. CosyVoice2 without RTVOICE_COSYVOICE_DIR).

    404, like OpenAI's unknown model: the condition lasts as long as the server's settings, so a client must not
    retry (a 503 would tell it to)."""

    status = 404


class StreamFailed(EngineError):
    status = 500
    type = "server_error"
