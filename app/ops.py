"""Operational routes: liveness, readiness, Prometheus metrics, the voice list."""

from __future__ import annotations

import asyncio
import os
import threading

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rtvoice.app.state import engine_of
from rtvoice.app.voice_fields import voice_fields

router = APIRouter(tags=["Operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (voices may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Voices are loaded and warmed: requests will be served (503 while loading, and from SIGTERM on); with the
    share of the admission budget still free (``room``) and the streams admitted and queued."""
    engine = request.app.state.engine
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not engine.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    counts = engine.stream_counts()
    return JSONResponse(
        {
            "status": "ready",
            # Loaded voices, without reading a shared voices directory: balancers probe every replica every second.
            "voices": engine.voices.ids(),
            "room": round(engine.room(), 3),  # what the agent-check weighs this replica by (app/agent.py)
            "active_streams": counts.active,
            "queued_streams": counts.queued,
        }
    )


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/voices")
async def voices(request: Request) -> list[dict[str, object]]:
    """Every voice: id (usable as ``voice`` or ``spk_id``), language, sample rate, model."""
    return [voice_fields(info) for info in engine_of(request).voice_infos()]


@router.get("/debug/process", include_in_schema=False)
async def process(request: Request) -> dict[str, object]:
    """What the process holds now, for soak runs and operators: memory, descriptors, tasks, connections, streams."""
    engine = request.app.state.engine
    drain = request.app.state.drain
    return {
        "rss_bytes": resident_bytes(),
        "open_fds": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None,
        "threads": threading.active_count(),
        "loop_tasks": len(asyncio.all_tasks()),
        "requests_in_flight": drain.requests_in_flight,
        "websockets": len(drain.sockets.sockets),
        "engine_active_streams": engine.stream_counts().active,
        "engine_queued_streams": engine.stream_counts().queued,
        "draining": drain.draining,
    }


def resident_bytes() -> int | None:
    """Resident memory now (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
