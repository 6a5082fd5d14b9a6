"""The playground page's first-audio readout beside the server's own ``ttfa_ms``, over HTTP (SSE) and the WebSocket,
in headless Chromium: how far apart they are (network, parsing, the page's own work), run by run.

    python -m bench.page_ttfa [--runs 10] [--url http://127.0.0.1:8000]

Without ``--url`` rtvoice runs as its own process. Each run speaks one sentence, with a fresh seed, on one
transport then the other, so both share the machine's conditions; two warm-up runs each come first. Figures are
p50/p95 of the page's readout, of the server's ``ttfa_ms`` and of their difference.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from typing import Any

from testkit.browser import launch_chromium
from testkit.servers import start_rtvoice

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs into the forest."
TRANSPORTS = ("http", "websocket")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def speak_once(page: Any, transport: str, seed: int) -> tuple[float, float]:
    """One utterance to its end; (the page's first audio, the server's ttfa_ms), in ms."""
    page.select_option("#transport", transport)
    page.fill("#seed", str(seed))
    page.click("#speak")
    page.wait_for_function("['done', 'error'].includes(window.rtvoice.state)", timeout=120_000)
    stats = page.evaluate("window.rtvoice")
    if stats["state"] == "error":
        raise RuntimeError(stats["errors"])
    return float(stats["ttfaMs"]), float(stats["serverTtfaMs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--url", help="an rtvoice server already running (default: start one)")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.url
        if url is None:
            server = start_rtvoice()
            stack.callback(server.stop)
            url = server.url
        browser = stack.enter_context(launch_chromium())
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_function("document.querySelectorAll('#voice option').length > 0", timeout=60_000)
        page.fill("#text", SENTENCE)
        results: dict[str, list[tuple[float, float]]] = {t: [] for t in TRANSPORTS}
        for run in range(args.runs + 2):
            for transport in TRANSPORTS:
                measured = speak_once(page, transport, seed=run)
                if run >= 2:
                    results[transport].append(measured)
    print(f"{'transport':<10} {'page p50/p95 ms':>16} {'server p50/p95 ms':>18} {'page - server p50/p95 ms':>25}")
    for transport, pairs in results.items():
        page_ms = [p for p, _ in pairs]
        server_ms = [s for _, s in pairs]
        gap = [p - s for p, s in pairs]
        print(
            f"{transport:<10} {statistics.median(page_ms):>8.0f}/{quantile(page_ms, 0.95):<7.0f}"
            f" {statistics.median(server_ms):>9.0f}/{quantile(server_ms, 0.95):<8.0f}"
            f" {statistics.median(gap):>15.0f}/{quantile(gap, 0.95):<9.0f}"
        )


if __name__ == "__main__":
    main()
