"""The demo page in headless Chromium (Debian's package, driven by Playwright): every transport speaks; the
API docs render with the network cut off."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Server


@pytest.fixture
def page(chromium, server: Server):  # type: ignore[no-untyped-def]
    context = chromium.new_context()
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_function("document.querySelectorAll('#voice option').length > 0", timeout=10_000)
    yield page
    context.close()


def speak(page, transport: str) -> dict:  # type: ignore[no-untyped-def]
    page.select_option("#transport", transport)
    page.click("#speak")
    page.wait_for_function("window.rtvoice.ttfaMs !== null", timeout=20_000)
    page.wait_for_function("window.rtvoice.maxLevel > 0.01", timeout=10_000)
    return page.evaluate("window.rtvoice")


def test_page_lists_voices_and_links(page) -> None:  # type: ignore[no-untyped-def]
    assert page.title() == "rtvoice"
    voices = page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert "en_US-joe-medium" in voices
    assert page.is_enabled("#speak") and page.is_disabled("#stop")


def test_webrtc_whep_speaks(page) -> None:  # type: ignore[no-untyped-def]
    stats = speak(page, "webrtc")
    assert stats["whepConnected"] and stats["packetsReceived"] > 0
    assert stats["errors"] == []
    print(f"browser WebRTC text -> first audio: {stats['ttfaMs']} ms")
    page.wait_for_function("window.rtvoice.events.some(e => e.type === 'audio_start')", timeout=10_000)


def test_webrtc_stop_cancels(page) -> None:  # type: ignore[no-untyped-def]
    page.fill("#text", " ".join(["This is a long text that keeps going so there is time to stop it."] * 6))
    speak(page, "webrtc")
    page.click("#stop")
    page.wait_for_function("window.rtvoice.events.some(e => e.type === 'cancelled')", timeout=10_000)


STORY = (
    "When the committee gathered in the old library on a rainy afternoon, nobody expected the meeting to run past "
    "midnight. The first item, a budget of $100 for new chairs, took an hour on its own. Then came the question "
    "of the roof, which had leaked every winter for a decade, and the argument began all over again."
)
WORD_DRIFT_S = 0.15
"""How far a highlight may stray from its word's place in the audio (timers and a shared machine's scheduling)."""


def speak_then_stop(page, server: Server, transport: str) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """Speak STORY, press Stop after a few words were highlighted; the page's record and the last word heard."""
    late_before = server.metric("rtvoice_late_chunks_total")
    page.fill("#text", STORY)
    speak(page, transport)
    page.wait_for_function("window.rtvoice.highlights.length >= 6", timeout=20_000)
    page.click("#stop")
    page.wait_for_function("window.rtvoice.heard !== null", timeout=10_000)
    stats = page.evaluate("window.rtvoice")
    # The audio paused where the server counted a chunk late or the page's own player ran dry (a loaded machine).
    stats["paused"] = server.metric("rtvoice_late_chunks_total") > late_before or stats["underruns"] > 0
    check_highlights_follow_the_audio(stats, late=stats["paused"])
    return stats, check_heard(page, stats)


def check_highlights_follow_the_audio(stats: dict, late: bool) -> None:
    """Each highlight is a word of the text, in order, and they are as far apart as the words are in the audio:
    highlighting on arrival would bunch them (WebSocket audio arrives in chunks, ahead of playback). Where the audio
    paused (``late``: a loaded machine), the highlights after the pause paused with it: they may then come later than
    the words' distance in the audio, never earlier."""
    marks = stats["highlights"]
    assert all(STORY[m["char_start"] : m["char_end"]] == m["text"] for m in marks), marks
    starts = [m["char_start"] for m in marks]
    assert starts == sorted(set(starts)), starts
    first = marks[0]
    # Each highlight's place against its word's: the origin is the earliest of the first three, so that one late
    # first highlight (the page is busiest as playback starts) does not make every later one look early.
    offsets = [m["at"] / 1000 - m["start_s"] for m in marks]
    origin = min(offsets[:3])
    drift = [offset - origin for offset in offsets]
    assert all(d > -WORD_DRIFT_S for d in drift), drift
    # One highlight may be held by a stall of the page's main thread (the audio plays on its own thread); words
    # highlighted as they arrive would bunch, many at once.
    assert late or sum(d >= WORD_DRIFT_S for d in drift) <= 1, drift
    shown = stats["highlights"][-1]
    print(
        f"{stats['transport']}: {len(marks)} highlights, drift {min(drift):+.3f}..{max(drift):+.3f} s, "
        f"first word {first['at'] - stats['firstAudioAt']:.0f} ms after first audio (its start_s "
        f"{first['start_s']:.3f}), last shown {shown['text']!r}"
    )


def check_heard(page, stats: dict) -> dict:  # type: ignore[no-untyped-def]
    """The page shows the text up to the end of a word: some of it, not all."""
    heard = stats["heard"]
    words = [e for e in stats["events"] if e["type"] == "word"]
    assert heard and STORY.startswith(heard) and len(heard) < len(STORY), heard
    ends = [w for w in words if w["char_end"] == len(heard)]
    assert ends, (heard, words)
    assert page.inner_text("#heard-text") == heard and page.inner_text("#transcript .heard") == heard
    return ends[0]


def test_websocket_highlights_words_as_played_and_stop_shows_heard(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    stats, last = speak_then_stop(page, server, "websocket")
    # The page plays its first chunk a moment after it arrives (and the output adds its latency), never before.
    first = stats["highlights"][0]
    assert 0 <= (first["at"] - stats["firstAudioAt"]) / 1000 - first["start_s"] < 0.3, (first, stats["firstAudioAt"])
    # Heard by the page's own playback clock, which runs behind what the server sent: the last heard word had ended
    # when Stop was pressed, and the word after it had not.
    played_s = (stats["stoppedAt"] - stats["firstAudioAt"]) / 1000
    words = [e for e in stats["events"] if e["type"] == "word"]
    after = [w for w in words if w["char_start"] >= last["char_end"]]
    assert last["end_s"] < played_s + WORD_DRIFT_S, (last, played_s)
    # After a pause less audio has played than the wall clock says: the next word may then have ended by it.
    assert stats["paused"] or not after or after[0]["end_s"] > played_s - WORD_DRIFT_S, (after[0], played_s)
    page.wait_for_function("window.rtvoice.events.some(e => e.type === 'cancelled')", timeout=10_000)
    events = page.evaluate("window.rtvoice.events")
    at_cancel = next(i for i, e in enumerate(events) if e["type"] == "cancelled")
    cancelled = events[at_cancel]
    if cancelled["delivered"]:
        sent = cancelled["delivered"][0]["last_word"]
        assert sent is not None and sent["char_end"] >= last["char_end"]  # the server sent at least what was heard
    else:
        # WebSocket audio runs ahead of playback: on a fast machine the whole utterance was sent before Stop, so its
        # `done` came first and there was nothing left to cut.
        done = [e for e in events[:at_cancel] if e["type"] == "done" and e["utterance"] == last["utterance"]]
        assert done and cancelled["utterances"] == [], (cancelled, events[:at_cancel][-3:])


def test_webrtc_highlights_words_as_played_and_stop_shows_heard(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    stats, last = speak_then_stop(page, server, "webrtc")
    # What the server says was played out to the player when it cancelled.
    cancelled = next(e for e in stats["events"] if e["type"] == "cancelled")
    assert cancelled["last_word"]["char_end"] == last["char_end"] and cancelled["request_id"] == "page-1"


def test_websocket_speaks(page) -> None:  # type: ignore[no-untyped-def]
    stats = speak(page, "websocket")
    assert stats["errors"] == []
    print(f"browser WebSocket text -> first audio: {stats['ttfaMs']} ms")


def test_http_speaks(page) -> None:  # type: ignore[no-untyped-def]
    stats = speak(page, "http")
    assert stats["errors"] == []
    print(f"browser HTTP text -> first audio: {stats['ttfaMs']} ms")


def test_a_keyed_server_asks_for_the_key_and_every_transport_sends_it(chromium, start_server) -> None:  # type: ignore[no-untyped-def]
    keyed = start_server(api_keys="page:sk-page-0123456789", warmup="false")
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(keyed.url + "/")
        page.wait_for_selector("#api-key", state="visible", timeout=10_000)
        page.wait_for_selector("#error[role=alert]:not([hidden])", timeout=10_000)
        assert "API key" in page.inner_text("#error") and page.evaluate("window.rtvoice.info.keys_required")
        assert page.eval_on_selector_all("#voice option", "options => options.length") == 0
        page.fill("#api-key", "sk-page-0123456789")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("document.querySelectorAll('#voice option').length > 0", timeout=10_000)
        for transport in ("http", "websocket", "webrtc"):
            page.evaluate("window.rtvoice.maxLevel = 0")
            stats = speak(page, transport)
            assert stats["errors"] == [], (transport, stats["errors"])
    finally:
        context.close()
    assert keyed.metric("rtvoice_key_requests_total", {"key": "page"}) >= 4  # voices, HTTP, WebSocket, WHEP
    info = httpx.get(f"{keyed.url}/v1/info")  # open, as the page needs it before it has a key
    assert info.status_code == 200 and info.json()["keys_required"] is True


@pytest.fixture
def offline_context(chromium):  # type: ignore[no-untyped-def]
    """A browser context cut off from everything but loopback; the requests it refused are kept."""
    context = chromium.new_context()
    refused: list[str] = []

    def route(route) -> None:  # type: ignore[no-untyped-def]
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost", "::1") or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", route)
    context.refused = refused
    yield context
    context.close()


def test_docs_render_offline(offline_context, server: Server) -> None:  # type: ignore[no-untyped-def]
    """Swagger UI at /docs loads from the server alone and lists the operations of /openapi.json."""
    page = offline_context.new_page()
    page.goto(server.url + "/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    shown = page.eval_on_selector_all(
        ".opblock",
        "blocks => blocks.map(b => [b.querySelector('.opblock-summary-method').textContent.toLowerCase(),"
        " b.querySelector('.opblock-summary-path').getAttribute('data-path')])",
    )
    expected = [[method, path] for path, operations in paths.items() for method in operations]
    assert {tuple(op) for op in shown} == {tuple(op) for op in expected}  # an operation with two tags shows twice
    # GET /inference_sft opened: its query parameters and the form body CosyVoice's client sends.
    page.click("#operations-CosyVoice-inference_sft_get .opblock-summary")
    page.wait_for_selector("#operations-CosyVoice-inference_sft_get .parameters .parameter__name", timeout=10_000)
    parameters = page.eval_on_selector_all(
        "#operations-CosyVoice-inference_sft_get .parameters .parameter__in",
        "cells => cells.map(c => c.textContent.trim())",
    )
    assert parameters and set(parameters) == {"(query)"}
    assert page.is_visible("#operations-CosyVoice-inference_sft_get .opblock-section-request-body")
    assert offline_context.refused == []

    assert httpx.get(f"{server.url}/redoc").status_code == 404  # no ReDoc: its page loads a logo from the network
