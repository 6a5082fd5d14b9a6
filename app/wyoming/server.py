"""The Wyoming TCP server: an asyncio server in the web server's event loop, one ``Connection`` per client, on the
engine that serves HTTP; with, optionally, its announcement on the local network (``discovery.py``).

``start`` binds it (an address that cannot be bound stops the server's start, as a taken HTTP port does);
``speaking`` tells the drain whether a connection still has speech in progress; ``shut_down`` (the drain's end)
stops listening and closes every connection, each still speaking told ``server_shutting_down``; ``close`` (the
lifespan's end) does the same and withdraws the announcement.
"""

from __future__ import annotations

import asyncio
import logging

from rtvoice.app.access import is_loopback
from rtvoice.app.wyoming.connection import Connection, Services
from rtvoice.app.wyoming.discovery import Announcement
from rtvoice.app.wyoming.framing import MAX_HEADER_LINE_BYTES

log = logging.getLogger(__name__)


class WyomingServer:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.connections: set[Connection] = set()
        self.announcement: Announcement | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] | None = None
        """Where it listens once started: host and port (the port the system chose for port 0)."""

    async def start(self, host: str, port: int) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_LINE_BYTES)
        except OSError as error:
            raise RuntimeError(f"cannot serve Wyoming on {host}:{port}: {error}") from error
        bound = self._server.sockets[0].getsockname()
        self.address = (host, int(bound[1]))
        log.info("Wyoming TTS server on tcp://%s:%d", f"[{host}]" if ":" in host else host, self.address[1])
        if not is_loopback(host):
            log.warning(
                "the Wyoming server listens on %s: Wyoming has no authentication (RTVOICE_API_KEYS does not apply), "
                "so anyone who reaches the port can synthesise; keep it on a trusted network",
                host,
            )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = Connection(reader, writer, self.services)
        self.connections.add(connection)
        try:
            await connection.run()
        except Exception:
            log.exception("Wyoming connection from %s failed", connection.peer)
            await connection.shut_down()
        finally:
            self.connections.discard(connection)
            self._tasks.discard(task)

    def speaking(self) -> bool:
        return any(connection.speaking() for connection in self.connections)

    async def shut_down(self) -> None:
        """Stop listening; close every connection (those still speaking get ``server_shutting_down`` first)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            await connection.shut_down()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def close(self) -> None:
        await self.shut_down()
        if self.announcement is not None:
            await self.announcement.withdraw()
            self.announcement = None
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
