"""The Wyoming server announced on the local network over mDNS (``RTVOICE_WYOMING_ZEROCONF``), as the ``wyoming``
library's servers announce themselves: a ``_wyoming._tcp.local.`` service with the server's address and port, which
Home Assistant discovers and offers to add.

Through the ``zeroconf`` package (the ``zeroconf`` extra), imported only when the announcement is asked for. A
server bound to every interface announces the address this machine reaches the local network from; one bound to
loopback announces nothing (no other machine could connect) and says so.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from importlib.util import find_spec
from typing import Any

from rtvoice.app.access import is_loopback

log = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
INSTANCE_NAME = "rtvoice"
"""The service's instance name; zeroconf appends a number when another server on the network has it."""
INSTALL_HINT = "pip install -e '.[zeroconf]'"
MDNS_GROUP = "224.0.0.251"


def require_zeroconf() -> None:
    """RuntimeError, saying what to install, when the announcement cannot be made here."""
    if find_spec("zeroconf") is None:
        raise RuntimeError(
            f"RTVOICE_WYOMING_ZEROCONF is set but zeroconf is not installed; install with: {INSTALL_HINT}"
        )


def local_address() -> str:
    """The address this machine reaches the local network from: the one a datagram socket would send mDNS from
    (connecting a datagram socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 5353))
        return str(probe.getsockname()[0])


def announced_address(host: str) -> str | None:
    """The address to announce for a server bound to ``host``; None for loopback."""
    if host in ("", "0.0.0.0", "::"):
        return local_address()
    if is_loopback(host):
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:  # a host name: the address it resolves to
        return socket.gethostbyname(host)


class Announcement:
    """A registered service; ``withdraw`` unregisters it and closes zeroconf's sockets."""

    def __init__(self, zeroconf: Any, service: Any) -> None:
        self._zeroconf = zeroconf
        self.service = service

    async def withdraw(self) -> None:
        try:
            await self._zeroconf.async_unregister_service(self.service)
        finally:
            await self._zeroconf.async_close()


async def announce(host: str, port: int, name: str = INSTANCE_NAME) -> Announcement | None:
    """Register the server listening on ``host:port``; None when it listens on loopback only."""
    require_zeroconf()
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    address = announced_address(host)
    if address is None:
        log.warning(
            "RTVOICE_WYOMING_ZEROCONF is set but the Wyoming server listens on loopback (%s): nothing announced; "
            "give RTVOICE_WYOMING_URI an address other machines reach (e.g. tcp://0.0.0.0:%d)",
            host,
            port,
        )
        return None
    service = AsyncServiceInfo(
        SERVICE_TYPE,
        f"{name}.{SERVICE_TYPE}",
        addresses=[ipaddress.ip_address(address).packed],
        port=port,
    )
    zeroconf = AsyncZeroconf()
    try:
        await zeroconf.async_register_service(service, allow_name_change=True)
    except BaseException:
        await zeroconf.async_close()
        raise
    log.info("Wyoming server announced over mDNS as %s (%s:%d)", service.name, address, port)
    return Announcement(zeroconf, service)
