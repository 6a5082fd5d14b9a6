"""A third-party WHEP player in headless Chromium: medooze's whip-whep client (npm), on a page of another origin.

Both ways of sending text are heard: ``POST <session>/speak`` and the player's
DataChannel. The page (``tests/whep_player/``) is served from another loopback
port than the server, so the WHEP POST, the trickle-ICE PATCH, ``/speak`` and the
DELETE all go through CORS. Timing is measured by ``bench/whep_browser.py``, not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testkit.browser import Missing, require_whep_player, serve_whep_player, skip_or_fail
from tests.conftest import Server

TEXT = "Hello! How can I help you today?"


@pytest.fixture(scope="module")
def player_url() -> Iterator[str]:
    try:
        require_whep_player()
    except Missing as missing:
        skip_or_fail(missing)
    with serve_whep_player() as url:
        yield url


@pytest.fixture
def player(chromium: Any, player_url: str) -> Iterator[Any]:
    context = chromium.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(player_url)
    page.wait_for_function("window.whepTestReady === true", timeout=10_000)
    yield page
    assert errors == []
    context.close()


@pytest.mark.parametrize("via", ["speak", "datachannel"])
def test_third_party_player_hears_speech(server: Server, player: Any, via: str) -> None:
    created = server.metric("rtvoice_whep_sessions_created_total")
    session = player.evaluate("(a) => whepTest.connect(a)", {"server": server.url, "datachannel": via == "datachannel"})
    assert session["origin"] != server.url and session["resource"].startswith(f"{server.url}/whep/")
    assert server.metric("rtvoice_whep_sessions_created_total") == created + 1
    result = player.evaluate("(a) => whepTest.speak(a)", {"via": via, "text": TEXT, "requestId": "r1"})
    stats = player.evaluate("() => whepTest.waitQuiet()")
    heard = player.evaluate("() => whepTest.heard()")
    print(f"\nwhip-whep in Chromium, text by {via}: first audible frame {result['firstAudibleMs']:.0f} ms after it")

    # Nothing reached the player before the text (media starts with it), then speech did.
    assert result["before"] is None or result["before"]["packetsReceived"] == 0
    assert stats["packetsReceived"] > 50 and stats["packetsLost"] == 0
    assert stats["totalAudioEnergy"] > 0.01 and stats["totalSamplesDuration"] > 1.0
    rms = (heard["energy"] / heard["samples"]) ** 0.5
    assert heard["peak"] > 0.1 and rms > 0.02, heard  # speech, far above the -40 dBFS onset threshold
    assert 0 < result["firstAudibleMs"] < 20_000

    if via == "speak":
        assert result["response"]["status"] == 202 and result["response"]["body"]["request_id"] == "r1"
    else:
        # Quiet audio can come before the last event (a slow machine's pause): wait for the utterance's end.
        player.wait_for_function("() => whepTest.state.events.some((e) => e.type === 'done')", timeout=30_000)
        events = player.evaluate("() => whepTest.state.events.map((e) => [e.type, e.request_id])")
        first = [event for event in events if event[0] != "word"][:3]  # words come between the first and last frame
        assert first == [["accepted", "r1"], ["audio_start", "r1"], ["done", "r1"]]
        assert ["word", "r1"] in events[2 : events.index(["done", "r1"])]

    resource = session["resource"]
    player.evaluate("() => whepTest.close()")  # the client's stop(): DELETE on the resource, cross-origin
    assert httpx.get(resource, timeout=10).status_code == 404
