"""The playground page at ``/`` in headless Chromium against the real server: accessibility (axe-core) in its idle,
speaking, error and dark states and at 375 px, speed, downloads (WebRTC's too: what its track played), the code panel
run for real, text typed like an LLM, the keyboard alone, a voice's preview and the waveform, a busy server's
Retry-After counted down, and ``GET /v1/info`` which the page sets itself up from. One browser for the module; each
test opens the page afresh in a context cut off from everything but the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from testkit.alignment import heard_as, to_aligner
from tests.audio import parse_wav, rms, same_speech
from tests.conftest import Server

SENTENCE = "The quick brown fox jumps over the lazy dog."
LONG_TEXT = " ".join(["This is a long text that keeps going so there is time to look at the page."] * 5)
PAGE_RATE = 24_000
SERIOUS = ("serious", "critical")


@pytest.fixture
def page(chromium, server: Server):  # type: ignore[no-untyped-def]
    """The page, in a context that refuses every request off the server's origin (none may leave it)."""
    context = chromium.new_context(accept_downloads=True)
    refused: list[str] = []

    def route(route) -> None:  # type: ignore[no-untyped-def]
        if urlsplit(route.request.url).netloc == urlsplit(server.url).netloc or route.request.url.startswith(
            ("data:", "blob:")
        ):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", route)
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_function(
        "document.querySelectorAll('#voice option').length > 0 && window.rtvoice.info", timeout=20_000
    )
    yield page
    context.close()
    assert refused == [], refused


def serious_violations(page) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in results.response["violations"]
        if v["impact"] in SERIOUS
    ]


def speak(page, transport: str, text: str, **fields: str) -> None:  # type: ignore[no-untyped-def]
    page.select_option("#transport", transport)
    page.fill("#text", text)
    for selector, value in fields.items():
        page.fill(f"#{selector}", value)
    page.click("#speak")


def wait_done(page) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    page.wait_for_function("window.rtvoice.state === 'done'", timeout=60_000)
    stats: dict[str, Any] = page.evaluate("window.rtvoice")
    return stats


def test_info_says_what_the_server_offers(server: Server) -> None:
    info = httpx.get(f"{server.url}/v1/info").json()
    assert info["max_text_chars"] == 4096 and info["speed"] == {"min": 0.25, "max": 4.0, "default": 1.0}
    assert {"mp3", "wav", "opus", "flac", "aac", "pcm"} == set(info["formats"])
    assert 24_000 in info["sample_rates"] and info["default_voice"] == "en_US-joe-medium"
    assert [m["model"] for m in info["models"]] == ["piper"] and info["models"][0]["voices"] >= 1
    assert info["cloning"] is False and info["keys_required"] is False and info["version"]
    favicon = httpx.get(f"{server.url}/favicon.ico")
    assert favicon.status_code == 200 and favicon.headers["content-type"].startswith("image/svg+xml")


def test_accessible_when_idle_speaking_failing_dark_and_narrow(page) -> None:  # type: ignore[no-untyped-def]
    assert serious_violations(page) == [], "idle"
    assert page.is_hidden("#clone")  # no model here can clone
    assert page.inner_text("#counter") == f"{len(page.input_value('#text'))} / 4096"

    speak(page, "websocket", LONG_TEXT)
    page.wait_for_function("window.rtvoice.highlights.length >= 2", timeout=30_000)
    assert page.get_attribute("#state", "role") == "status" and page.is_enabled("#stop")
    assert serious_violations(page) == [], "speaking"
    page.keyboard.press("Escape")
    page.wait_for_function("window.rtvoice.state === 'stopped'", timeout=10_000)

    # The server refuses markup that does not parse: its code, field and request id in the alert; readout reset.
    speak(page, "http", "<speak><p>never closed</speak>")
    page.wait_for_selector("#error[role=alert]:not([hidden])", timeout=20_000)
    alert = page.inner_text("#error")
    error = page.evaluate("window.rtvoice.lastError")
    assert error["code"] == "invalid_ssml" and error["param"] == "input" and error["request_id"], error
    assert "invalid_ssml" in alert and "input" in alert and error["request_id"] in alert, alert
    assert page.get_attribute("#text", "aria-invalid") == "true"
    assert page.evaluate("window.rtvoice.markupWarning")  # the page warned before it sent the markup
    assert page.inner_text("#ttfa") == "–" and page.is_disabled("#stop")
    assert serious_violations(page) == [], "error"

    page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert page.get_attribute("#theme", "aria-pressed") == "true"
    assert serious_violations(page) == [], "dark"

    # 375 px wide: nothing wider than the screen; every button, select and field at least 44 px tall.
    page.set_viewport_size({"width": 375, "height": 740})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    small = page.evaluate(
        """[...document.querySelectorAll('button, select, input:not([type=checkbox]), textarea')]
            .filter(e => e.offsetParent !== null && e.getBoundingClientRect().height < 44).map(e => e.id)"""
    )
    assert small == []
    assert serious_violations(page) == [], "375 px"


def pcm_samples(server: Server, text: str, **fields: object) -> int:
    response = httpx.post(
        f"{server.url}/v1/audio/speech",
        json={"model": "tts-1", "input": text, "voice": "en_US-joe-medium", "response_format": "pcm", **fields},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return len(response.content) // 2


SPEED_2_LENGTH = (0.4, 0.6)
"""At speed 2 the audio is 0.5 ± 0.1 of its length at speed 1 (the issue's bound; the voice's own frames are halved
to one, ``engine/models/piper/pace.py``)."""


def test_speed_2_shortens_the_audio_and_done_follows_playback(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    lengths = {}
    for speed in ("1", "2"):
        page.evaluate(f"document.getElementById('speed').value = '{speed}'")
        speak(page, "websocket", SENTENCE, seed="5")
        stats = wait_done(page)
        assert stats["errors"] == [] and stats["rate"] == PAGE_RATE
        lengths[speed] = stats["samplesPlayed"]
        # "done" only once the audio has played out here, and then Stop is off and no word is highlighted.
        heard_s = (stats["finishedAt"] - stats["firstAudioAt"]) / 1000
        assert heard_s >= stats["samplesPlayed"] / PAGE_RATE - 0.05, (heard_s, stats["samplesPlayed"])
        assert page.is_disabled("#stop") and page.query_selector("#transcript mark") is None
        assert stats["serverTtfaMs"] is not None and page.inner_text("#server-ttfa").endswith("ms")
    # The page played what the server makes at each speed, whole.
    assert lengths == {speed: pcm_samples(server, SENTENCE, seed=5, speed=float(speed)) for speed in lengths}
    assert SPEED_2_LENGTH[0] < lengths["2"] / lengths["1"] < SPEED_2_LENGTH[1], lengths


def test_downloads_are_what_played_and_history_replays(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    speak(page, "http", SENTENCE, seed="11")
    stats = wait_done(page)
    assert stats["serverTtfaMs"] is not None and len(stats["words"]) == 9  # HTTP highlights from speech.word
    assert [h["text"] for h in stats["highlights"]][:3] == ["The", "quick", "brown"]
    with page.expect_download() as download:
        page.click("#download-wav")
    header, samples = parse_wav(Path(download.value.path()).read_bytes())
    assert header["sample_rate"] == PAGE_RATE and len(samples) == stats["samplesPlayed"]
    # The same request, made here: the page played (and saved) every sample of it.
    direct = httpx.post(
        f"{server.url}/v1/audio/speech",
        json={
            "model": "tts-1",
            "input": SENTENCE,
            "voice": stats["info"]["default_voice"],
            "response_format": "pcm",
            "seed": 11,
        },
        timeout=60,
    )
    want = np.frombuffer(direct.content, dtype="<i2")
    assert same_speech(samples, want)  # two runs chunk by their own time budgets: equal to rounding

    with page.expect_download() as download:
        page.click("#download-vtt")
    vtt = Path(download.value.path()).read_text()
    assert vtt.startswith("WEBVTT") and vtt.count("-->") == len(stats["words"])
    with page.expect_download() as download:
        page.click("#download-json")
    words = json.loads(Path(download.value.path()).read_text())["words"]
    assert [w["text"] for w in words] == [w["text"] for w in stats["words"]]
    page.select_option("#format", "flac")
    with page.expect_download() as download:
        page.click("#download-format")
    assert Path(download.value.path()).read_bytes()[:4] == b"fLaC"

    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.click("#history li button")
    page.wait_for_function("window.rtvoice.state === 'done'", timeout=30_000)
    assert page.evaluate("window.rtvoice.replays") == 1 and requests == []


def speech_s(samples: np.ndarray, rate: int) -> float:
    """Seconds from the first sample above -60 dBFS to the last: the speech, not the silences around it."""
    audible = np.flatnonzero(np.abs(samples.astype(np.int32)) > 32768 * 1e-3)
    return float(audible[-1] + 1 - audible[0]) / rate


def test_webrtc_download_is_the_audio_the_track_played(page, server: Server) -> None:  # type: ignore[no-untyped-def]
    """WebRTC has no PCM of its own on the page: the WAV is what the received track played, recorded in the page.
    Opus and the player's jitter buffer (which may play it a little faster) change its samples, so it is judged as
    speech: as long as the request made directly, and heard as its sentence rather than another."""
    underrun_before = server.metric("rtvoice_whep_underrun_seconds_total")
    speak(page, "webrtc", SENTENCE, seed="11")
    stats = wait_done(page)
    with page.expect_download() as download:
        page.click("#download-wav")
    header, samples = parse_wav(Path(download.value.path()).read_bytes())
    rate = header["sample_rate"]
    assert rate == stats["rate"] and len(samples) == stats["samplesPlayed"] > 0
    direct = httpx.post(
        f"{server.url}/v1/audio/speech",
        json={"model": "tts-1", "input": SENTENCE, "voice": stats["info"]["default_voice"], "response_format": "pcm"}
        | {"seed": 11},
        timeout=60,
    )
    want_s = speech_s(np.frombuffer(direct.content, dtype="<i2"), PAGE_RATE)
    # Longer by the silence the server sent where its audio ran out (a loaded machine; the server counts it).
    underrun_s = server.metric("rtvoice_whep_underrun_seconds_total") - underrun_before
    played_s = speech_s(samples, rate)
    assert -0.15 * want_s <= played_s - want_s <= 0.15 * want_s + underrun_s, (played_s, want_s, underrun_s)
    choices = [SENTENCE.lower().rstrip("."), "my sister bought a small house near the river last summer"]
    assert heard_as(to_aligner(samples, rate), choices) == choices[0]


def run_snippet(command: list[str], cwd: Path, name: str) -> np.ndarray:
    env = {**os.environ, "RTVOICE_API_KEY": "unused"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    header, samples = parse_wav((cwd / name).read_bytes())
    assert header["sample_rate"] == PAGE_RATE
    return samples


def test_the_code_panel_runs_against_the_server(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page.fill("#text", "Code that speaks.")
    page.click("#ssml button:text-is('break')")  # an SSML snippet at the caret, sent in the code below
    assert page.input_value("#text") == 'Code that speaks.<break time="500ms"/>'
    page.fill("#seed", "3")
    page.select_option("#format", "wav")
    page.click("#code summary")
    code = {name: page.inner_text(f"#code-{name}") for name in ("curl", "python", "openai", "js")}
    assert all("RTVOICE_API_KEY" in text for text in code.values()), code
    (tmp_path / "httpx_snippet.py").write_text(code["python"])
    (tmp_path / "openai_snippet.py").write_text(code["openai"])
    (tmp_path / "snippet.mjs").write_text(code["js"])
    commands = [
        ["bash", "-c", code["curl"]],
        [sys.executable, "httpx_snippet.py"],
        [sys.executable, "openai_snippet.py"],
    ]
    if shutil.which("node"):  # Node comes with npm, which make test uses for the WHEP player where it can
        commands.append(["node", "snippet.mjs"])
    for command in commands:
        samples = run_snippet(command, tmp_path, "speech.wav")
        assert len(samples) > PAGE_RATE // 2 and rms(samples) > 0.01, command
        (tmp_path / "speech.wav").unlink()


def test_typed_like_an_llm_audio_starts_before_the_last_fragment(page) -> None:  # type: ignore[no-untyped-def]
    page.check("#llm")
    page.evaluate("document.getElementById('llm-rate').value = '12'")
    speak(page, "webrtc", LONG_TEXT)  # fragments always go over the WebSocket
    page.wait_for_function("window.rtvoice.llm && window.rtvoice.llm.lastSentAt !== null", timeout=60_000)
    stats = page.evaluate("window.rtvoice")
    assert stats["transport"] == "websocket" and stats["llm"]["fragments"] > 50
    assert stats["firstAudioAt"] is not None and stats["firstAudioAt"] < stats["llm"]["lastSentAt"], stats["llm"]
    page.click("#stop")


def test_speak_and_stop_from_the_keyboard(page) -> None:  # type: ignore[no-untyped-def]
    page.select_option("#transport", "websocket")
    page.fill("#text", LONG_TEXT)
    page.click("#theme")  # then from the toggle at the top to the text box, by Tab alone
    page.click("#theme")
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "text":
            break
    assert page.evaluate("document.activeElement.id") == "text"
    page.keyboard.press("Control+Enter")
    page.wait_for_function("window.rtvoice.ttfaMs !== null", timeout=30_000)
    page.keyboard.press("Escape")
    page.wait_for_function("window.rtvoice.state === 'stopped'", timeout=10_000)
    assert page.is_disabled("#stop") and page.evaluate("window.rtvoice.heard") is not None
    # Speak is a button in the tab order: Enter on it speaks again.
    page.focus("#speak")
    page.keyboard.press("Enter")
    page.wait_for_function("window.rtvoice.runs === 2 && window.rtvoice.ttfaMs !== null", timeout=30_000)
    page.keyboard.press("Escape")
    page.wait_for_function("window.rtvoice.state === 'stopped'", timeout=10_000)


def test_preview_speaks_the_voice_and_the_waveform_draws_it_with_word_ticks(page) -> None:  # type: ignore[no-untyped-def]
    """Preview says the voice's name over HTTP; the canvas then holds the audio heard, drawn in the accent colour, and
    a tick in the text colour at each word's start along its top edge."""
    page.click("#preview")
    stats = wait_done(page)
    assert stats["errors"] == [] and stats["samplesPlayed"] > PAGE_RATE // 2
    assert page.inner_text("#transcript").startswith("Hello, this is ")
    words = stats["words"]
    assert len(words) >= 4, words
    drawn = page.evaluate(
        """() => {
          const canvas = document.getElementById("waveform");
          const { width, height } = canvas;
          const pixels = canvas.getContext("2d").getImageData(0, 0, width, height).data;
          const style = getComputedStyle(document.documentElement);
          const rgb = (name) => {
            const probe = document.createElement("canvas").getContext("2d");
            probe.fillStyle = style.getPropertyValue(name).trim();
            probe.fillRect(0, 0, 1, 1);
            return Array.from(probe.getImageData(0, 0, 1, 1).data.slice(0, 3));
          };
          const accent = rgb("--accent"), text = rgb("--text");
          const same = (i, c) => pixels[i + 3] > 0 && [0, 1, 2].every((k) => Math.abs(pixels[i + k] - c[k]) < 8);
          let wave = 0;
          for (let i = 0; i < pixels.length; i += 4) if (same(i, accent)) wave += 1;
          const ticks = [];
          for (let x = 0; x < width; x++) if (same(4 * x, text) && !same(4 * (x - 1), text)) ticks.push(x);
          return { width, height, wave, ticks };
        }"""
    )
    # Bars fill a visible share of the canvas; the ticks are as many as the words (two may share a pixel column).
    assert drawn["wave"] > 0.02 * drawn["width"] * drawn["height"], drawn
    assert len(words) - 2 <= len(drawn["ticks"]) <= len(words), (drawn["ticks"], words)


def test_a_busy_server_s_retry_after_is_counted_down_before_speak_is_offered(  # type: ignore[no-untyped-def]
    chromium, start_server
) -> None:
    """On a server with one stream's room and no queue, held by a WebSocket utterance whose text is still open: Speak
    gets a 503, and the alert counts down its Retry-After with Speak disabled, then says it can be retried and
    enables Speak; once the room is free, the retry speaks."""
    from websockets.sync.client import connect

    busy = start_server(max_active_streams="1", max_queued_streams="0", warmup="false")
    context = chromium.new_context()
    try:
        with connect(busy.url.replace("http://", "ws://") + "/v1/tts/stream") as holder:
            holder.send(json.dumps({"type": "start"}))
            holder.send(json.dumps({"type": "text", "text": SENTENCE + " And"}))  # the next word ends the sentence
            while not isinstance(holder.recv(timeout=30), bytes):  # speaking, its input open: it holds the room
                pass
            page = context.new_page()
            page.goto(busy.url + "/")
            page.wait_for_function("document.querySelectorAll('#voice option').length > 0 && window.rtvoice.info")
            speak(page, "http", SENTENCE)
            page.wait_for_function("window.rtvoice.lastError && window.rtvoice.lastError.retry_after_s", timeout=10_000)
            seconds = page.evaluate("window.rtvoice.lastError.retry_after_s")
            assert seconds >= 1 and page.is_disabled("#speak")
            assert f"Retry in {seconds} s." in page.inner_text("#error")
        page.wait_for_function(
            "document.getElementById('error').innerText.includes('You can retry now.')", timeout=(seconds + 3) * 1000
        )
        assert page.is_enabled("#speak")
        speak(page, "http", SENTENCE)  # the WebSocket closed, its stream with it: the retry speaks
        assert wait_done(page)["samplesPlayed"] > 0
    finally:
        context.close()
