"""Wyoming, Home Assistant's protocol for local voice services: a TTS server on ``RTVOICE_WYOMING_URI``.

One module per protocol object: ``framing.py`` (events on the wire, read and written by the ``wyoming`` package,
within limits), ``info.py`` (``describe`` → ``info``), ``voice.py`` (a request's ``voice``), ``synthesis.py`` (one
``synthesize`` or streaming session: one engine stream, and its audio events), ``connection.py`` (what each event
does, answers in order), ``server.py`` (the TCP listener in the web server's event loop, its connections, the
drain), ``discovery.py`` (the optional mDNS announcement, ``RTVOICE_WYOMING_ZEROCONF``).
"""

from __future__ import annotations

import logging

from wyoming.event import Event

from rtvoice.app.drain import Drain
from rtvoice.app.metrics import RequestMetrics
from rtvoice.app.settings import Settings
from rtvoice.app.wyoming import discovery
from rtvoice.app.wyoming.connection import Services
from rtvoice.app.wyoming.info import info_event
from rtvoice.app.wyoming.server import WyomingServer
from rtvoice.engine.engine import Engine

__all__ = ["WyomingServer", "serve"]

log = logging.getLogger(__name__)


async def serve(
    engine: Engine, settings: Settings, requests: RequestMetrics, drain: Drain, version: str, url: str
) -> WyomingServer:
    """Start the Wyoming server ``settings`` ask for in the running event loop (the caller closes it), announced
    over mDNS when they say so. RuntimeError when its address cannot be bound, or when the announcement is asked for
    and zeroconf is not installed; an announcement that fails on the network is logged, and the server goes on.
    ``version`` and ``url`` (rtvoice's page) go into its ``info``."""
    address = settings.wyoming_address
    if address is None:
        raise ValueError("RTVOICE_WYOMING_URI is not set")
    if settings.wyoming_zeroconf:
        discovery.require_zeroconf()  # before anything is bound

    def info() -> Event:
        return info_event(engine.voice_infos(), engine.default_voice_id, version, url)

    server = WyomingServer(
        Services(engine=engine, metrics=requests, drain=drain, max_block_bytes=settings.max_body_bytes, info=info)
    )
    await server.start(*address)
    if settings.wyoming_zeroconf:
        assert server.address is not None
        try:
            server.announcement = await discovery.announce(*server.address)
        except Exception:
            log.exception("the Wyoming server could not be announced over mDNS; add it in Home Assistant by address")
    return server
