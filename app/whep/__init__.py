"""WebRTC playback of speech over WHEP (draft-ietf-wish-whep), on aiortc.

A player POSTs an SDP offer to ``/whep`` and gets one Opus audio track back; it
sends text on a DataChannel (or to ``/whep/{id}/speak``) and hears it spoken.
``install`` wires the endpoint into the application; ``shutdown`` closes every
session when the application stops.
"""

from __future__ import annotations

from fastapi import FastAPI

from rtvoice.app.errors import ShuttingDown, error_fields
from rtvoice.app.whep.cors import WhepPreflight
from rtvoice.app.whep.endpoint import WhepEndpoint
from rtvoice.app.whep.messages import event
from rtvoice.app.whep.router import router

__all__ = ["install", "shutdown", "router", "WhepEndpoint"]


def install(app: FastAPI) -> None:
    """The WHEP routes, their endpoint (on ``app.state.whep``) and the preflight headers.

    Call it after the CORS middleware is added, so the preflight wrapper sits outside it.
    """
    app.state.whep = WhepEndpoint(app.state.settings, app.state.engine)
    app.include_router(router)
    app.add_middleware(WhepPreflight)


async def shutdown(app: FastAPI, notify: bool = False) -> None:
    """Close every session; with ``notify``, each hears a ``server_shutting_down`` error event first."""
    endpoint: WhepEndpoint | None = getattr(app.state, "whep", None)
    if endpoint is None:
        return
    if notify:
        goodbye = event("error", **error_fields(ShuttingDown()))
        for resource in list(endpoint.sessions.values()):
            resource.broadcast(goodbye)
    await endpoint.close_all()


def speaking(app: FastAPI) -> bool:
    """Some session has an utterance playing or queued (a drain waits for it)."""
    endpoint: WhepEndpoint | None = getattr(app.state, "whep", None)
    return endpoint is not None and any(r.playback.pending for r in endpoint.sessions.values())
