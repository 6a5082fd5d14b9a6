"""ICE servers: the settings' STUN/TURN list as aiortc configuration and as WHEP ``Link`` headers, and TURN
credentials minted per request from a shared secret (TURN's REST-API scheme, coturn's ``use-auth-secret``).

With no servers configured the server gathers host candidates only. aiortc would
otherwise fall back to a public STUN server, which costs seconds per answer on a
network that cannot reach it, so the empty list is always passed explicitly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCIceServer

_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None
    client_only: bool = False
    """Offered to players only; the server's own gathering does not use it."""


def parse_ice_servers(entries: Sequence[Mapping[str, object]]) -> list[IceServer]:
    """Validate the ``whep_ice_servers`` setting; raises ValueError naming the bad entry."""
    servers = []
    for index, entry in enumerate(entries):
        unknown = set(entry) - {"urls", "username", "credential", "client_only"}
        if unknown:
            raise ValueError(f"whep_ice_servers[{index}]: unknown keys {sorted(unknown)}")
        urls = entry.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"whep_ice_servers[{index}]: 'urls' must be a URL or a non-empty list of URLs")
        for url in urls:
            if not url.startswith(_SCHEMES):
                raise ValueError(f"whep_ice_servers[{index}]: {url!r} is not a stun:, stuns:, turn: or turns: URL")
        username, credential = _optional_str(entry, "username", index), _optional_str(entry, "credential", index)
        client_only = entry.get("client_only", False)
        if not isinstance(client_only, bool):
            raise ValueError(f"whep_ice_servers[{index}]: 'client_only' must be true or false")
        servers.append(IceServer(tuple(urls), username, credential, client_only))
    return servers


def _optional_str(entry: Mapping[str, object], name: str, index: int) -> str | None:
    """``entry[name]`` when it is a string, None when absent (or null); ValueError naming the entry otherwise."""
    value = entry.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"whep_ice_servers[{index}]: '{name}' must be a string")
    return value


def rtc_configuration(servers: list[IceServer]) -> RTCConfiguration:
    """The peer connection's configuration: the servers it gathers with, never aiortc's public default."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in servers
            if not s.client_only
        ]
    )


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def link_headers(servers: list[IceServer]) -> list[str]:
    """One ``Link: <url>; rel="ice-server"`` value per URL, with the credentials when set."""
    links = []
    for server in servers:
        for url in server.urls:
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f"; username={_quoted(server.username)}"
            if server.credential is not None:
                link += f'; credential={_quoted(server.credential)}; credential-type="password"'
            links.append(link)
    return links


def turn_rest_credentials(secret: str, ttl_s: int, user: str, now_s: float) -> tuple[str, str]:
    """A TURN username valid until ``now_s + ttl_s`` for ``user`` and its password: the base64 HMAC-SHA1 of the
    username under the TURN server's shared secret, which the TURN server recomputes (no password is stored)."""
    username = f"{int(now_s) + ttl_s}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()
