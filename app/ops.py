"""Operational routes: liveness, readiness, Prometheus metrics, the voice list."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rtvoice.app.state import engine_of

router = APIRouter(tags=["Operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (voices may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Voices are loaded and warmed: requests will be served."""
    engine = request.app.state.engine
    if not engine.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready", "voices": engine.voices.ids()})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/voices")
async def voices(request: Request) -> list[dict[str, object]]:
    """Every voice: id (usable as ``voice`` or ``spk_id``), language, sample rate, model."""
    return [info.__dict__ for info in engine_of(request).voice_infos()]
