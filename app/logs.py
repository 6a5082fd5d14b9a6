"""One log format for rtvoice, uvicorn and the libraries: time, level, logger, message.

uvicorn's access lines take the same prefix. Requests to the probe routes (``/healthz``, ``/readyz``,
``/metrics``) stay out of the access log: an orchestrator polls them every few seconds, and readiness is
announced once, by the ``ready`` line, instead of by a run of ``/readyz 503`` lines.
"""

from __future__ import annotations

import logging
import logging.config
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
ACCESS_FORMAT = '%(asctime)s %(levelname)-7s %(name)s: %(client_addr)s "%(request_line)s" %(status_code)s'
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class ProbeFilter(logging.Filter):
    """Drops uvicorn's access lines for the probe routes."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn.access logs with args (client_addr, method, full_path, http_version, status_code).
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3:
            return str(args[2]).split("?", 1)[0] not in PROBE_PATHS
        return True


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
        "filters": {"probes": {"()": ProbeFilter}, "uvicorn_name": {"()": UvicornName}},
        "formatters": {
            "default": {"format": LOG_FORMAT},
            "access": {"()": "uvicorn.logging.AccessFormatter", "fmt": ACCESS_FORMAT, "use_colors": False},
        },
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr",
                        "filters": ["uvicorn_name"]},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stderr",
                       "filters": ["probes"]},
        },
        "root": {"handlers": ["default"], "level": "WARNING"},
        "loggers": {
            "rtvoice": {"level": level},
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
        },
    }


def configure(level: str) -> None:
    """Apply :func:`log_config` in this process (``rtvoice say``; ``serve`` hands the dict to uvicorn)."""
    import uvicorn.config  # noqa: F401  (registers the TRACE level name uvicorn's log levels include)

    logging.config.dictConfig(log_config(level))
