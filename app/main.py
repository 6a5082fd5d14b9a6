"""The ASGI application: routes, error handling, metrics, and the engine's lifetime."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from rtvoice.app import (
    cartesia,
    cosyvoice_api,
    cosyvoice_grpc,
    errors,
    info,
    lexicons,
    openai_speech,
    ops,
    piper_api,
    whep,
)
from rtvoice.app.access import Access, AccessControl, KeyRing, warn_if_open
from rtvoice.app.agent import serve_agent
from rtvoice.app.drain import Drain, DrainGate
from rtvoice.app.info import package_version
from rtvoice.app.limits import BodyLimit, OpenSockets, WebSocketLimits
from rtvoice.app.metrics import RequestMetrics
from rtvoice.app.openapi import install as install_openapi
from rtvoice.app.request_context import RequestContext
from rtvoice.app.settings import Settings
from rtvoice.app.websocket.router import router as websocket_router
from rtvoice.app.wyoming import serve as serve_wyoming
from rtvoice.engine.engine import Engine

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def base_url(host: str, port: int) -> str:
    """The URL a person on this machine opens: loopback when the server listens on every interface."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _start_engine(engine: Engine, settings: Settings) -> None:
    await engine.start()
    # What the start made lives as long as the process: frozen out of the collector's reach, its full collections
    # (which hold the event loop) scan only what requests make (docs/decisions.md).
    gc.collect()
    gc.freeze()
    url = base_url(settings.host, settings.port)
    everywhere = " (listening on every interface)" if settings.host in ("0.0.0.0", "::", "") else ""
    log.info(
        "ready%s: the page at %s/, API docs at %s/docs; default voice %s (voices: %d)",
        everywhere,
        url,
        url,
        engine.default_voice_id,
        len(engine.voice_infos()),
    )


async def shut_down_wyoming(app: FastAPI) -> None:
    """The drain's end: close the Wyoming server's connections (those still speaking told so first)."""
    if app.state.wyoming is not None:
        await app.state.wyoming.shut_down()


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()
    engine = engine or Engine(settings)
    keys = KeyRing.from_settings(settings)
    access = Access(keys, settings, engine.metrics.registry)
    request_metrics = RequestMetrics(engine.metrics.registry)
    sockets = OpenSockets()
    drain = Drain(settings.drain_timeout_s, sockets)

    def start_failed(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("engine failed to start: %s", task.exception(), exc_info=task.exception())
            app.state.start_failed = True  # app/server.py stops the process (exit code 1)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warn_if_open(settings, keys)
        # Load voices in the background: /healthz answers at once, /readyz once they are warm.
        loading = asyncio.create_task(_start_engine(engine, settings))
        loading.add_done_callback(start_failed)
        grpc_server = None
        agent_server = None
        try:
            if settings.grpc_port:  # CosyVoice's gRPC service, same loop and engine
                grpc_server = await cosyvoice_grpc.serve(
                    engine, settings.host, settings.grpc_port, request_metrics, access, drain
                )
            if settings.agent_port:  # HAProxy's agent-check: this replica's room, or drain
                agent_server = await serve_agent(app, settings.host, settings.agent_port)
            if settings.wyoming_uri:  # Wyoming's TTS server (Home Assistant), same loop and engine
                app.state.wyoming = await serve_wyoming(
                    engine, settings, request_metrics, drain, package_version(), base_url(settings.host, settings.port)
                )
            yield
        finally:
            if app.state.wyoming is not None:
                await app.state.wyoming.close()
                app.state.wyoming = None
            if agent_server is not None:
                agent_server.close()
            if grpc_server is not None:
                await grpc_server.stop(grace=None)
            if not loading.done():
                loading.cancel()
            await whep.shutdown(app)  # WHEP: close every session before the engine goes
            await engine.stop()

    # FastAPIOffline: FastAPI whose /docs (Swagger UI) loads its script and style from files the package ships,
    # not from a CDN, so the docs work offline. No ReDoc: its page fetches Redocly's logo from the network.
    app = FastAPIOffline(
        title="rtvoice",
        summary="Real-time text-to-speech: streaming HTTP, WebSocket and WebRTC (WHEP) on one scheduler.",
        lifespan=lifespan,
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.settings = settings
    app.state.drain = drain
    app.state.request_metrics = request_metrics
    app.state.start_failed = False
    app.state.wyoming = None  # the Wyoming server (app/wyoming) while it runs
    errors.install(app)
    app.include_router(ops.router)
    app.include_router(info.router)
    app.include_router(openai_speech.router)
    app.include_router(cosyvoice_api.router)
    app.include_router(websocket_router)
    app.include_router(cartesia.router)
    app.include_router(piper_api.router)
    app.include_router(lexicons.router)
    install_openapi(app)  # the request bodies' schemas, which the routes above refer to
    # Middleware, innermost first: input limits, then keys and quotas, then the drain gate, CORS (so that a 401
    # or 429 reaches a browser page readably), WHEP's preflight headers, and outermost the request's id, access
    # line and count (so that every answer, refusals included, has them).
    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(WebSocketLimits, settings=settings, sockets=sockets)
    app.add_middleware(AccessControl, access=access)
    app.add_middleware(DrainGate, drain=drain)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.cors_allow_origins,
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["Location", "ETag", "Link", "X-Sample-Rate", "X-Voice", "Retry-After", "X-Request-ID"],
    )
    whep.install(app)  # WHEP routes and endpoint; after CORS, so its preflight headers wrap CORS's answer
    app.add_middleware(RequestContext, metrics=request_metrics)
    drain.busy.append(lambda: engine.ready and engine.busy())
    drain.busy.append(lambda: whep.speaking(app))
    drain.busy.append(lambda: app.state.wyoming is not None and app.state.wyoming.speaking())
    drain.finishers.append(lambda: whep.shutdown(app, notify=True))
    drain.finishers.append(lambda: shut_down_wyoming(app))
    if WEB_DIR.is_dir():
        # The page at "/" and its files under /web; no catch-all mount, so unknown
        # routes and wrong methods still get their 404 and 405.
        @app.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(WEB_DIR / "index.html")

        @app.get("/favicon.ico", include_in_schema=False)
        async def favicon() -> FileResponse:  # browsers ask for it whatever the page links
            return FileResponse(WEB_DIR / "favicon.svg", media_type="image/svg+xml")

        app.mount("/web", StaticFiles(directory=WEB_DIR), name="web")
    else:
        log.warning("no demo page: %s is missing (an install without rtvoice.web), so GET / answers 404", WEB_DIR)
    return app
