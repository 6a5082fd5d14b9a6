"""HAProxy's agent-check (``agent-check`` on a server line): a TCP port that answers each connection with one line,
this replica's weight as the share of the engine's admission budget still free (``Engine.room``), as ``ready up
40%``, so the balancer sends new streams where there is room; ``drain`` when it has none (a new stream would
queue), or while the server drains or loads: it gets no new streams, but its sessions still reach it. (When every
replica says ``drain``, deploy/haproxy/haproxy.cfg shares new streams out anyway, to wait in the replicas' own
queues.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI

log = logging.getLogger(__name__)

MIN_WEIGHT_PERCENT = 1
"""A replica with a little room left keeps at least this weight (HAProxy's percentages of a weight of 100)."""


def agent_reply(app: FastAPI) -> str:
    """The line HAProxy reads: ``drain`` while draining, loading or full, else ``ready up <weight>%``."""
    engine = app.state.engine
    if app.state.drain.draining or not engine.ready:
        return "drain\n"
    room = engine.room()
    if room <= 0:
        return "drain\n"
    # "ready" ends a DRAIN this agent set earlier; "up" alone would leave it (HAProxy keeps the two states apart).
    return f"ready up {max(MIN_WEIGHT_PERCENT, round(100 * room))}%\n"


async def serve_agent(app: FastAPI, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port``; each connection gets the reply and is closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(agent_reply(app).encode())
            await writer.drain()
        except (ConnectionError, RuntimeError) as error:
            log.debug("agent-check reply not sent: %s", error)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(answer, host, port)
