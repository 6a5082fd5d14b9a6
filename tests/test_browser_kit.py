"""The browser tests' own rule: what they need and lack makes them skip, or fail under RTVOICE_REQUIRE_BROWSER=1,
whatever is missing (Chromium, Playwright, the WHEP player's npm package)."""

from __future__ import annotations

import sys

import pytest

from testkit import browser
from testkit.browser import Missing, launch_chromium, skip_or_fail


def test_a_missing_playwright_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # importing it raises ImportError
    monkeypatch.setattr(browser, "chromium_path", lambda: "/usr/bin/chromium")
    with pytest.raises(Missing, match="playwright"), launch_chromium():
        pass


def test_a_missing_chromium_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    with pytest.raises(Missing, match="chromium"), launch_chromium():
        pass


@pytest.mark.parametrize(
    "required,outcome", [("1", pytest.fail.Exception), ("", pytest.skip.Exception), ("0", pytest.skip.Exception)]
)
def test_missing_fails_only_when_required(
    monkeypatch: pytest.MonkeyPatch, required: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("RTVOICE_REQUIRE_BROWSER", required)
    with pytest.raises(outcome, match="playwright is not installed"):
        skip_or_fail(Missing("playwright is not installed"))
