"""What reading SSML costs in time to first audio: in-process, and over loopback HTTP.

    python -m bench.ssml_ttfa [--runs 15] [--in-process]

In-process: each SSML document and its plain text (the same words) go through a stream's segmenter (markup read,
plan, segments normalised), and the median time per document and the difference are printed. Over HTTP: one rtvoice
server (OpenAI's route, raw PCM); each document is asked as SSML and as its plain text in turn, and the median TTFA of
each and their difference are printed (``--in-process`` leaves this part out: no server, seconds, and quiet enough
to run beside other work). The target is that SSML adds at most 2 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from rtvoice.engine.ssml import MarkupRules
from rtvoice.engine.text import Segmenter
from testkit.servers import Server, start_rtvoice

DOCUMENTS = [
    (
        '<speak>The first part is done.<break time="500ms"/>The second part starts now.</speak>',
        "The first part is done. The second part starts now.",
    ),
    (
        '<speak><prosody rate="110%">Welcome back to the show,</prosody> '
        '<emphasis level="moderate">everyone</emphasis>.</speak>',
        "Welcome back to the show, everyone.",
    ),
    (
        '<speak>Ask <sub alias="World Wide Web">WWW</sub> for code <say-as interpret-as="characters">XK9</say-as>'
        ' on <say-as interpret-as="date" format="mdy">12/25/2026</say-as>.</speak>',
        "Ask World Wide Web for code X K nine on December twenty fifth twenty twenty six.",
    ),
    (
        '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
        '<voice name="en-US-AvaNeural"><mstts:express-as style="cheerful">Great news today</mstts:express-as>'
        '<mark name="m1"/>, the order shipped.</voice></speak>',
        "Great news today, the order shipped.",
    ),
]


def read_s(text: str, rounds: int = 200) -> float:
    """Median seconds to plan and segment ``text`` as a stream's segmenter does."""
    times = []
    for _ in range(rounds):
        segmenter = Segmenter(90, 300, "en", 20, rules=MarkupRules())
        start = time.perf_counter()
        segmenter.push(text)
        segmenter.close()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ttfa_s(client: httpx.Client, server: Server, text: str) -> float:
    body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm", "seed": 1}
    start = time.perf_counter()
    with client.stream("POST", f"{server.url}/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if chunk:
                return time.perf_counter() - start
    raise RuntimeError("no audio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--in-process", action="store_true", help="only the in-process part: no server")
    args = parser.parse_args()

    print(f"{'in process (ms per document, median)':58} {'ssml':>7} {'plain':>7} {'added':>6}")
    for ssml, plain in DOCUMENTS:
        ssml_ms, plain_ms = read_s(ssml) * 1e3, read_s(plain) * 1e3
        print(f"{ssml[:58]:58} {ssml_ms:7.3f} {plain_ms:7.3f} {ssml_ms - plain_ms:6.3f}")
    if args.in_process:
        return

    server = start_rtvoice()
    try:
        print(f"\n{'over HTTP (TTFA ms, median)':58} {'ssml':>7} {'plain':>7} {'added':>6}")
        with httpx.Client(timeout=120) as client:
            for ssml, plain in DOCUMENTS[:2]:
                ttfa_s(client, server, ssml)  # warm the connection and the voice
                ttfa_s(client, server, plain)
            added = []
            for ssml, plain in DOCUMENTS:
                with_markup, without = [], []
                for _ in range(args.runs):  # in turn, so that the machine's drift falls on both
                    with_markup.append(ttfa_s(client, server, ssml))
                    without.append(ttfa_s(client, server, plain))
                ssml_ms, plain_ms = statistics.median(with_markup) * 1e3, statistics.median(without) * 1e3
                added.append(ssml_ms - plain_ms)
                print(f"{ssml[:58]:58} {ssml_ms:7.1f} {plain_ms:7.1f} {ssml_ms - plain_ms:6.1f}")
            print(f"{'median added':58} {'':7} {'':7} {statistics.median(added):6.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
