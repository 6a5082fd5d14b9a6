"""WebRTC through a TURN server: coturn (Debian's package) on loopback with TURN's REST-API shared secret, and a
player that may use relayed candidates only. Its credentials come from WHEP's ``Link: rel="ice-server"`` headers,
minted per request from ``RTVOICE_TURN_SECRET``; the speech still arrives."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from testkit.cluster import MissingTool, free_port_range, require_tool, skip_or_fail
from testkit.polling import wait_for
from testkit.servers import die_with_parent
from testkit.whep_client import WhepPlayer
from tests.conftest import Server

SECRET = "test-only-turn-secret-4c1e"
TTL_S = 600
LINK = re.compile(
    r'<(?P<url>[^>]+)>; rel="ice-server"(?:; username="(?P<username>[^"]*)")?(?:; credential="(?P<cred>[^"]*)")?'
)


@pytest.fixture(scope="module")
def turn_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """coturn on 127.0.0.1 (relays on loopback too), REST-API credentials only."""
    try:
        turnserver = require_tool("turnserver", "coturn")
    except MissingTool as missing:
        skip_or_fail(missing)
    port = free_port_range(42)
    process = subprocess.Popen(
        [
            turnserver,
            "-n",  # no configuration file
            "--listening-ip=127.0.0.1",
            "--relay-ip=127.0.0.1",
            f"--listening-port={port}",
            f"--min-port={port + 2}",
            f"--max-port={port + 41}",
            "--use-auth-secret",
            f"--static-auth-secret={SECRET}",
            "--realm=rtvoice",
            "--allow-loopback-peers",  # the player and rtvoice are both on loopback here
            "--fingerprint",
            "--no-cli",
            "--no-tls",
            "--no-dtls",
            "--no-tcp-relay",
            f"--pidfile={tmp_path_factory.mktemp('turn') / 'turnserver.pid'}",
            "--log-file=stdout",
        ],
        stdout=subprocess.DEVNULL,
        preexec_fn=die_with_parent(),
    )
    assert wait_for(lambda: udp_listening(port) or process.poll() is not None, 30), "coturn did not start"
    assert process.poll() is None, f"coturn exited with {process.returncode}"
    yield port
    process.terminate()
    process.wait(timeout=10)


def udp_listening(port: int) -> bool:
    """Something listens on UDP 127.0.0.1:``port`` (Linux's /proc/net/udp)."""
    wanted = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as table:
        return any(line.split()[1] == wanted for line in table.readlines()[1:])


@pytest.fixture(scope="module")
def turn_server(start_server: Callable[..., Server], turn_port: int) -> Server:
    return start_server(
        turn_urls=f'["turn:127.0.0.1:{turn_port}?transport=udp"]',
        turn_secret=SECRET,
        turn_credential_ttl_s=str(TTL_S),
        warmup="false",
    )


def ice_links(response: httpx.Response) -> list[re.Match[str]]:
    return [m for value in response.headers.get_list("link") if (m := LINK.match(value))]


def test_credentials_are_minted_per_request_from_the_secret(turn_server: Server) -> None:
    first, second = (httpx.options(f"{turn_server.url}/whep") for _ in range(2))
    names = []
    for response in (first, second):
        (link,) = ice_links(response)
        username, credential = link["username"], link["cred"]
        expiry, _, user = username.partition(":")
        assert abs(int(expiry) - (time.time() + TTL_S)) < 60 and user
        expected = base64.b64encode(hmac.new(SECRET.encode(), username.encode(), hashlib.sha1).digest()).decode()
        assert credential == expected
        names.append(username)
    assert names[0] != names[1], "a credential must not be shared between requests"


def test_relay_only_player_hears_the_speech(turn_server: Server, turn_port: int) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            (link,) = ice_links(await client.options(f"{turn_server.url}/whep"))
            configuration = RTCConfiguration(
                iceServers=[RTCIceServer(urls=[link["url"]], username=link["username"], credential=link["cred"])],
                iceTransportPolicy=RTCIceTransportPolicy.RELAY,
            )
            player = await WhepPlayer(turn_server.url, http=client, configuration=configuration).start()
            try:
                offer = player.pc.localDescription.sdp
                candidates = re.findall(r"a=candidate:\S+ \d+ udp \d+ \S+ \d+ typ (\w+)", offer)
                assert candidates and set(candidates) == {"relay"}, candidates  # connected through coturn, then
                assert player.location is not None and player.response is not None
                session_id = player.location.rsplit("/", 1)[1]
                (answer_link,) = ice_links(player.response)
                assert answer_link["username"].endswith(f":{session_id}")
                sent = time.monotonic()
                spoken = await client.post(f"{player.session_url}/speak", json={"text": "Relayed through TURN."})
                assert spoken.status_code == 202, spoken.text
                frame = await player.wait_for_speech(sent, timeout=30)
                assert frame.rms > 0.01
            finally:
                await player.close()

    asyncio.run(run())
