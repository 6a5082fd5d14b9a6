"""Speak -> first audible frame in Chromium, through a third-party WHEP player, for /speak and the DataChannel.

    python -m bench.whep_browser [--runs 6] [--scenarios at-once after-800ms play-at-text] [--load 0] [--url URL]

Each run opens a new WHEP session from a page of another origin (medooze's
``whip-whep`` client from npm, ``tests/whep_player/``; ``make whep-player``
installs it) in headless Chromium, speaks a sentence, waits until it has
played, and speaks it again on the same session: the first utterance of a
session and a later one. Text goes by ``POST <session>/speak`` in one session
and on the player's DataChannel in the other. Scenarios:

- ``at-once``: the player plays from the moment it connects; the text goes as
  soon as the connection (and DataChannel) is up;
- ``after-800ms``: the same, the text 800 ms after the connection is up;
- ``play-at-text``: connected for 800 ms, then the player starts playback and
  sends the text together (a player whose user presses play): what reached the
  browser before playback waits in its jitter buffer.

Reported per scenario, path and utterance, p50/p95 over the runs:

- player: text sent -> the first 128-sample WebAudio quantum of the received
  track above -40 dBFS RMS (an AudioWorklet): the first audible frame;
- server: the same requests' text in -> first frame handed to the RTP sender
  (``rtvoice_whep_first_frame_seconds``), the same-run reference;
- after: player - server, the part after the server (network, jitter buffer,
  decoding, playout and the voice's own leading silence, reported once);
- the receiver's jitter buffer over the utterance (getStats deltas): average
  delay and target delay per emitted sample, samples removed by acceleration
  and inserted by deceleration, and samples concealed during the speech that were
  not silent (gaps a listener hears).

``--load K`` keeps K HTTP synthesis streams running in the background (other
listeners of the same server).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from bench.whep_listeners import percentile
from testkit.browser import launch_chromium, serve_whep_player
from testkit.servers import Server, metrics, start_rtvoice

TEXT = "Hello! How can I help you today?"
LOAD_TEXT = (
    "Thanks for calling. Your order left our warehouse this morning, and it should arrive on Thursday "
    "between nine and eleven."
)
AUDIBLE_RMS = 0.01
"""The page's threshold (tests/whep_player/player.js): -40 dBFS over one 128-sample quantum."""
PATHS = ("speak", "datachannel")
SCENARIOS = {
    # name: (wait after connecting before the text, ms; playback starts with the text)
    "at-once": (0, False),
    "after-800ms": (800, False),
    "play-at-text": (800, True),
}


def first_frame_metric(url: str, source: str) -> tuple[float, float]:
    """(sum, count) of rtvoice_whep_first_frame_seconds for ``source``."""
    total, count = "rtvoice_whep_first_frame_seconds_sum", "rtvoice_whep_first_frame_seconds_count"
    read = metrics(url, (total, count), {"source": source})
    return read[total], read[count]


def voice_onset_ms(url: str, text: str) -> float:
    """Where the voice's first audible 128-sample quantum lies in its own 48 kHz audio for ``text``."""
    response = httpx.post(
        f"{url}/inference_sft", data={"tts_text": text, "format": "pcm", "sample_rate": "48000"}, timeout=60
    )
    response.raise_for_status()
    pcm = np.frombuffer(response.content, dtype=np.int16).astype(np.float32) / 32768
    blocks = pcm[: len(pcm) // 128 * 128].reshape(-1, 128)
    loud = np.flatnonzero(np.sqrt((blocks**2).mean(axis=1)) > AUDIBLE_RMS)
    return float(loud[0] * 128 / 48) if len(loud) else float("nan")


@dataclass
class Sample:
    player_ms: float
    server_ms: float | None
    jitter: dict[str, float]

    @property
    def after_ms(self) -> float | None:
        return None if self.server_ms is None else self.player_ms - self.server_ms


@dataclass
class Series:
    samples: list[Sample] = field(default_factory=list)

    def figure(self, pick: Any) -> str:
        values = [v for v in (pick(s) for s in self.samples) if v is not None]
        if not values:
            return f"{'-':>11}"
        return f"{statistics.median(values):>5.0f}/{percentile(values, 0.95):<5.0f}"

    def mean(self, key: str) -> float:
        values = [s.jitter[key] for s in self.samples if key in s.jitter]
        return statistics.fmean(values) if values else float("nan")


def jitter_window(before: dict[str, Any] | None, onset: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """The receiver's jitter buffer over one utterance, from getStats() when the text left (None: no media yet),
    at its first audible frame and once it has played."""

    def delta(name: str, start: dict[str, Any] | None = before) -> float:
        return float((after.get(name) or 0) - ((start or {}).get(name) or 0))

    emitted = max(delta("jitterBufferEmittedCount"), 1.0)
    return {
        "delay_ms": 1000 * delta("jitterBufferDelay") / emitted,
        "target_ms": 1000 * delta("jitterBufferTargetDelay") / emitted,
        "removed": delta("removedSamplesForAcceleration"),
        "inserted": delta("insertedSamplesForDeceleration"),
        "speech_concealed": delta("concealedSamples", onset) - delta("silentConcealedSamples", onset),
    }


class BackgroundLoad:
    """K HTTP synthesis streams kept running against the server, each in a thread, until stopped."""

    def __init__(self, url: str, streams: int) -> None:
        self.url = url
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(streams)]

    def _run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                with http.stream(
                    "POST", f"{self.url}/inference_sft", data={"tts_text": LOAD_TEXT, "format": "pcm"}
                ) as response:
                    for _ in response.iter_bytes():
                        if self._stop.is_set():
                            break

    def __enter__(self) -> BackgroundLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class Player:
    """One WHEP session from the player page, in a browser context of its own; ``connect``: the page's
    ``whepTest.connect`` options besides the server."""

    def __init__(self, browser: Any, page_url: str, server_url: str, **connect: Any) -> None:
        self.server_url = server_url
        self.context = browser.new_context()
        try:
            self.page = self.context.new_page()
            self.page.goto(page_url)
            self.page.wait_for_function("window.whepTestReady === true")
            self.resource = self.page.evaluate("(a) => whepTest.connect(a)", {"server": server_url, **connect})[
                "resource"
            ]
        except BaseException:
            self.context.close()
            raise

    def speak(
        self, via: str, text: str, request_id: str, **more: Any
    ) -> tuple[dict[str, Any], dict[str, Any], float | None]:
        """One utterance, sent ``via`` the DataChannel or HTTP, played out: the page's result of ``whepTest.speak``,
        its stats once quiet, and the server's time to this utterance's first frame (ms; None unless it counted
        just this one)."""
        total_before, count_before = first_frame_metric(self.server_url, via)
        result = self.page.evaluate(
            "(a) => whepTest.speak(a)", {"via": via, "text": text, "requestId": request_id, **more}
        )
        quiet = self.page.evaluate("() => whepTest.waitQuiet()")
        total_after, count_after = first_frame_metric(self.server_url, via)
        server_ms = 1000 * (total_after - total_before) if count_after - count_before == 1 else None
        return dict(result), dict(quiet), server_ms

    def close(self) -> None:
        try:
            self.page.evaluate("() => whepTest.close()")
        finally:
            self.context.close()


def one_session(
    browser: Any, page_url: str, url: str, via: str, text: str, settle_ms: int, play_at_text: bool, utterances: int
) -> list[Sample]:
    """One WHEP session from the player page: ``utterances`` sentences, one after the other."""
    player = Player(browser, page_url, url, datachannel=via == "datachannel", playAtSpeak=play_at_text)
    try:
        if settle_ms:
            player.page.wait_for_timeout(settle_ms)
        samples = []
        for index in range(utterances):
            result, quiet, server_ms = player.speak(via, text, f"r{index}")
            samples.append(
                Sample(result["firstAudibleMs"], server_ms, jitter_window(result["before"], result["at"], quiet))
            )
        return samples
    finally:
        player.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="sessions per scenario and path (two utterances each)")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--load", type=int, default=0, help="HTTP synthesis streams running in the background")
    parser.add_argument("--url", help="an rtvoice server already running (default: start one)")
    args = parser.parse_args()

    server: Server | None = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        server = start_rtvoice()
        url = server.url
    series = {
        (scenario, via, which): Series() for scenario in args.scenarios for via in PATHS for which in ("first", "next")
    }
    try:
        onset_ms = voice_onset_ms(url, args.text)
        with launch_chromium() as browser, serve_whep_player() as page_url, BackgroundLoad(url, args.load):
            one_session(browser, page_url, url, "datachannel", args.text, 0, False, 1)  # one-time costs
            for run in range(args.runs):
                for scenario in args.scenarios:
                    settle_ms, play_at_text = SCENARIOS[scenario]
                    for via in PATHS:
                        first, following = one_session(
                            browser, page_url, url, via, args.text, settle_ms, play_at_text, 2
                        )
                        series[(scenario, via, "first")].samples.append(first)
                        series[(scenario, via, "next")].samples.append(following)
                print(f"run {run + 1}/{args.runs} done", flush=True)
    finally:
        if server is not None:
            server.stop()

    print(
        f"\n{args.runs} sessions per scenario and path, {args.load} background HTTP streams, {os.cpu_count()} CPUs "
        f"shared by server, browser and load; text {args.text!r}. The voice's first audible quantum lies "
        f"{onset_ms:.0f} ms into its own audio."
    )
    print(
        "ms from text sent, p50/p95. player: first audible WebAudio quantum; server: first frame handed to the RTP "
        "sender (same requests); after: player - server."
    )
    print(
        f"{'scenario':<13} {'path':<12} {'utterance':<9} {'player':>11} {'server':>11} {'after':>11} "
        f"{'jb delay':>8} {'jb target':>9} {'removed':>8} {'inserted':>8} {'concealed':>9}"
    )
    for (scenario, via, which), s in series.items():
        print(
            f"{scenario:<13} {via:<12} {which:<9} {s.figure(lambda x: x.player_ms)} "
            f"{s.figure(lambda x: x.server_ms)} {s.figure(lambda x: x.after_ms)} "
            f"{s.mean('delay_ms'):>8.0f} {s.mean('target_ms'):>9.0f} {s.mean('removed'):>8.0f} "
            f"{s.mean('inserted'):>8.0f} {s.mean('speech_concealed'):>9.0f}"
        )
    print(
        "jb delay/target: mean ms per emitted sample over the utterance (getStats); removed/inserted: samples "
        "time-stretched away/in; concealed: samples concealed during the speech that were not silent (a stall or "
        "late audio). Means per utterance."
    )


if __name__ == "__main__":
    main()
