"""The WHEP endpoint: creates session resources from offers, finds them, sweeps idle ones, counts everything.

One per application. It holds the sessions by id, admits at most
``whep_max_sessions`` (counting offers still being answered), owns every task a
session starts, and publishes gauges and counters in the engine's Prometheus
registry so that leaks show: sessions, open peer connections and tasks all
return to zero when players leave.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections.abc import Coroutine
from typing import Any

from aiortc import RTCPeerConnection
from prometheus_client import Gauge

from rtvoice.app.settings import Settings
from rtvoice.app.whep.ice import (
    IceServer,
    link_headers,
    parse_ice_servers,
    rtc_configuration,
    turn_rest_credentials,
)
from rtvoice.app.whep.metrics import WhepMetrics
from rtvoice.app.whep.resource import SessionContext, WhepResource
from rtvoice.app.whep.sdp import Offer
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import Overloaded
from rtvoice.engine.models.base import VoiceInfo

log = logging.getLogger(__name__)


class AtCapacity(Overloaded):
    """503 with Retry-After, like the engine's own overload, but for sessions."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            retry_after_s=2,
            message=f"the server already holds {limit} WHEP sessions; retry shortly",
            code="too_many_sessions",
        )


class WhepEndpoint:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.ice_servers: list[IceServer] = parse_ice_servers(settings.whep_ice_servers)
        self.link_headers = link_headers(self.ice_servers)
        self.turn_urls = tuple(settings.turn_urls) if settings.turn_secret else ()
        self.max_sessions = settings.whep_max_sessions
        self.idle_timeout_s = settings.whep_idle_timeout_s
        self.token = settings.whep_token
        self.sessions: dict[str, WhepResource] = {}
        self._reserved = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self._peer_connections: weakref.WeakSet[RTCPeerConnection] = weakref.WeakSet()
        self._sweeper: asyncio.Task[None] | None = None

        registry = engine.metrics.registry
        self._gauges = [
            Gauge("rtvoice_whep_sessions", "WHEP sessions open", registry=registry),
            Gauge("rtvoice_whep_peer_connections", "WHEP peer connections not yet closed", registry=registry),
            Gauge("rtvoice_whep_tasks", "Tasks WHEP sessions are running", registry=registry),
        ]
        self._gauges[0].set_function(lambda: len(self.sessions))
        self._gauges[1].set_function(self.open_peer_connections)
        self._gauges[2].set_function(lambda: len(self.tasks))
        self.metrics = WhepMetrics(registry)
        self._session_context = SessionContext(
            engine=engine,
            rtc_configuration=rtc_configuration(self.ice_servers),
            max_pending=settings.whep_max_pending_requests,
            max_message_bytes=settings.whep_max_message_bytes,
            metrics=self.metrics,
            spawn=self.spawn,
            on_closed=self.forget,
            id_prefix=f"{settings.replica_id}~" if settings.replica_id else "",
            opus_fec=settings.whep_opus_fec,
            red=settings.whep_red,
            send_loss=settings.whep_send_loss,
        )
        if settings.whep_send_loss:
            log.warning(
                "RTVOICE_WHEP_SEND_LOSS=%s: a test hook drops that share of every WHEP session's audio packets; "
                "never set it in production",
                settings.whep_send_loss,
            )

    # -- sessions -----------------------------------------------------------------------------------

    async def create(self, offer: Offer, voice: VoiceInfo) -> tuple[WhepResource, str]:
        """A new session answering ``offer``; raises AtCapacity, or SdpError for an offer it cannot answer."""
        if len(self.sessions) + self._reserved >= self.max_sessions:
            raise AtCapacity(self.max_sessions)
        self._reserved += 1
        resource = None
        try:
            resource = WhepResource(self._session_context, voice)
            self._peer_connections.add(resource.pc)
            answer = await resource.answer(offer)
        except BaseException:
            if resource is not None:
                await resource.close("offer_rejected")
            raise
        finally:
            self._reserved -= 1
        self.sessions[resource.id] = resource
        self.metrics.created.inc()
        self._start_sweeper()
        return resource, answer

    def links(self, user: str) -> list[str]:
        """``Link`` header values for one answer: the configured ICE servers, then the TURN servers with a
        credential for ``user`` minted now from the shared secret (so no player holds a lasting password)."""
        if not self.turn_urls:
            return self.link_headers
        username, credential = turn_rest_credentials(
            self.settings.turn_secret, self.settings.turn_credential_ttl_s, user, time.time()
        )
        return [*self.link_headers, *link_headers([IceServer(self.turn_urls, username, credential, client_only=True)])]

    def get(self, session_id: str) -> WhepResource | None:
        return self.sessions.get(session_id)

    def forget(self, resource: WhepResource, reason: str) -> None:
        """Called by a closing session: it is no longer reachable."""
        if self.sessions.pop(resource.id, None) is not None:
            self.metrics.closed.labels(reason).inc()

    async def close_all(self) -> None:
        """Shutdown: close every session, stop the sweeper, wait for the tasks sessions left."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        await asyncio.gather(*(s.close("shutdown") for s in list(self.sessions.values())), return_exceptions=True)
        pending = [t for t in self.tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)

    # -- tasks and the idle sweep -------------------------------------------------------------------

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("whep task %s failed", task.get_name(), exc_info=task.exception())

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self.spawn(self._sweep(), "whep-idle-sweep")

    async def _sweep(self) -> None:
        """Close sessions idle past the timeout; ends when no session is left (restarted with the next)."""
        period = max(0.1, min(1.0, self.idle_timeout_s / 4))
        while self.sessions:
            await asyncio.sleep(period)
            now = time.monotonic()
            for resource in list(self.sessions.values()):
                if resource.idle_for(now) > self.idle_timeout_s:
                    resource.close_soon("idle_timeout")

    # -- counters -----------------------------------------------------------------------------------

    def open_peer_connections(self) -> int:
        return sum(1 for pc in list(self._peer_connections) if pc.connectionState != "closed")

    def debug(self) -> dict[str, Any]:
        """Leak accounting: what WHEP holds now (collects garbage first, so 'alive' means referenced)."""
        gc.collect()
        return {
            "sessions": len(self.sessions),
            "reserved": self._reserved,
            "peer_connections_open": self.open_peer_connections(),
            "peer_connections_alive": len(self._peer_connections),
            "session_tasks": len(self.tasks),
            "loop_tasks": len(asyncio.all_tasks()),
            "engine_active_streams": self.engine.stream_counts().active,
            "engine_queued_streams": self.engine.stream_counts().queued,
            "session_ids": sorted(self.sessions),
        }
