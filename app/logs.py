"""One log format for rtvoice, uvicorn and the libraries: time, level, logger, message (and the request's id).

A line written while a request runs ends with `` request_id=...``. The access log is rtvoice's own
(``rtvoice.access``, written by ``app/request_context.py``: route, status, key name, time to first audio, audio
seconds), so uvicorn's access lines and its WebSocket handshake lines (which would show an ``api_key`` query
value) are left out. Requests to the probe routes (``/healthz``, ``/readyz``, ``/metrics``) stay out of the
access log: an orchestrator polls them every few seconds, and readiness is announced once, by the ``ready``
line, instead of by a run of ``/readyz 503`` lines.
"""

from __future__ import annotations

import logging
import logging.config
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(request_suffix)s"


class UvicornHandshakeFilter(logging.Filter):
    """Drops uvicorn's WebSocket handshake lines: rtvoice's access line says the same, without the key."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith('%s - "WebSocket %s"'))


class UvicornName(logging.Filter):
    """Shows uvicorn's main logger, ``uvicorn.error``, as ``uvicorn``: most of its lines are not errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error":
            record.name = "uvicorn"
        return True


def log_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict: rtvoice and uvicorn at ``level``, other libraries' warnings."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "uvicorn_name": {"()": UvicornName},
            "handshakes": {"()": UvicornHandshakeFilter},
            "request_id": {"()": "rtvoice.app.request_context.RequestIdFilter"},
        },
        "formatters": {"default": {"format": LOG_FORMAT}},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
                "filters": ["uvicorn_name", "handshakes", "request_id"],
            },
        },
        "root": {"handlers": ["default"], "level": "WARNING"},
        "loggers": {
            "rtvoice": {"level": level},
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"level": "WARNING"},  # replaced by rtvoice.access
        },
    }


def configure(level: str) -> None:
    """Apply :func:`log_config` in this process (``rtvoice say``; ``serve`` hands the dict to uvicorn)."""
    import uvicorn.config  # noqa: F401  (registers the TRACE level name uvicorn's log levels include)

    logging.config.dictConfig(log_config(level))
