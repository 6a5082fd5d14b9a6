"""Headless Chromium for the browser tests and benchmarks, and the third-party WHEP player page they drive.

Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright. The WHEP
player page (``tests/whep_player/``: medooze's ``whip-whep`` client from npm,
pinned by its package-lock.json and installed by ``make test`` with ``npm ci``)
is served by a small static server on another loopback port than rtvoice, so
its WHEP requests are cross-origin, as from any page that embeds a player.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--autoplay-policy=no-user-gesture-required",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--mute-audio",
    "--use-fake-device-for-media-stream",  # a microphone that plays a tone, granted without asking (the page's
    "--use-fake-ui-for-media-stream",  # recording of a cloning prompt)
]
WHEP_PLAYER_DIR = Path(__file__).resolve().parent.parent / "tests" / "whep_player"
"""The player page stays with the tests that drive it; ``make whep-player`` installs its npm package there."""
WHEP_CLIENT_JS = WHEP_PLAYER_DIR / "node_modules" / "whip-whep" / "whep.js"


class Missing(Exception):
    """Something the browser tests need is not installed (the message says what and how to get it)."""


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise Missing("chromium is not installed (make browser installs Debian's package as root)")
    return found


def require_whep_player() -> None:
    if not WHEP_CLIENT_JS.is_file():
        raise Missing(f"the WHEP player library is not installed: run `npm ci` in {WHEP_PLAYER_DIR} (make test does)")


@contextmanager
def launch_chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's sync API); raises Missing when chromium or Playwright is absent."""
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        raise Missing("playwright is not installed (the test extra has it)") from error
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def serve_whep_player() -> Iterator[str]:
    """Serve the player page on a free loopback port (another origin than rtvoice's); yields its URL."""
    require_whep_player()
    handler = functools.partial(_QuietHandler, directory=str(WHEP_PLAYER_DIR))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def skip_or_fail(missing: Missing) -> NoReturn:
    """Skip a browser test for something missing; fail it instead under RTVOICE_REQUIRE_BROWSER=1."""
    import pytest

    if os.environ.get("RTVOICE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{missing} and RTVOICE_REQUIRE_BROWSER=1")
    pytest.skip(str(missing))
