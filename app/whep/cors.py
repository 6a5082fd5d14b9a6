"""CORS preflights for WHEP paths: the headers a browser player reads, on the preflight answer too.

The application's CORSMiddleware answers preflights itself, before any route
runs, with no ``Accept-Post`` and no ``Access-Control-Expose-Headers``. This
wraps it and adds both to the answer of an ``OPTIONS`` request on a WHEP path.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EXPOSED = "Location, ETag, Link, Retry-After"


class WhepPreflight:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if (
            scope["type"] != "http"
            or scope["method"] != "OPTIONS"
            or not (path == "/whep" or path.startswith("/whep/"))
        ):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "access-control-expose-headers" not in headers:
                    headers["Access-Control-Expose-Headers"] = EXPOSED
                if path == "/whep" and "accept-post" not in headers:
                    headers["Accept-Post"] = "application/sdp"
                elif path != "/whep" and "accept-patch" not in headers:
                    headers["Accept-Patch"] = "application/trickle-ice-sdpfrag"
            await send(message)

        await self.app(scope, receive, send_with_headers)
