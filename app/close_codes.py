"""WebSocket close codes (RFC 6455 and IANA's registry) and reasons: every WebSocket transport closes with these."""

from __future__ import annotations

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013

SHUTTING_DOWN = "server shutting down"
"""The reason a socket closed by the drain carries, with ``CLOSE_GOING_AWAY``."""
INTERNAL_ERROR = "internal error"
