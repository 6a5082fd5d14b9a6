"""What the spoken form costs in time to first audio, over loopback HTTP (``bench/spoken.py`` times it in-process).

    python -m bench.normalize_ttfa [--runs 15]

One rtvoice server (``/inference_sft``, raw PCM); each sentence is asked with ``normalize`` true and false in turn,
and the median TTFA of each and their difference are printed (a spoken form is also longer to say, which its first
chunk pays).
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from testkit.servers import Server, start_rtvoice

WRITTEN = [
    "He was born on 07/04/1990.",
    "Mix 3/4 cup of flour with 2 tbsp. of sugar at 350°F.",
    "Chapter IV begins on page 237.",
    "The meeting moved to 10:45 a.m. on Tuesday.",
    "Dr. Smith paid $1,250.75 on Jan. 5th, 2027 at 3:30 pm.",
    "The train departs at 18:20 from platform 3.",
    "Call me at (555) 123-4567 or write to bob@example.com.",
    "Revenue rose 15% to $3.2 million.",
    "Keep it under 60 km/h with 5 kg on board.",
    "Henry VIII had six wives.",
]
PLAIN = [
    "The quick brown fox jumps over the lazy dog by the river.",
    "Real-time speech is judged by its first word.",
    "A listener forgives a voice that pauses to think, but not one that keeps them waiting.",
    "Later chunks grow, because by then the listener already has audio to play.",
]


def ttfa_s(client: httpx.Client, server: Server, text: str, normalize: bool) -> float:
    start = time.perf_counter()
    form = {"tts_text": text, "format": "pcm", "seed": "1", "normalize": str(normalize).lower()}
    with client.stream("POST", f"{server.url}/inference_sft", data=form) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if chunk:
                return time.perf_counter() - start
    raise RuntimeError("no audio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    server = start_rtvoice()
    try:
        print(f"{'over HTTP (TTFA ms, median)':58} {'spoken':>7} {'as sent':>8} {'added':>6}")
        with httpx.Client(timeout=120) as client:
            for text in WRITTEN[:3]:
                ttfa_s(client, server, text, True)  # warm the connection and the voice
            added = []
            for text in WRITTEN + PLAIN:
                on, off = [], []
                for _ in range(args.runs):  # in turn, so that the machine's drift falls on both
                    on.append(ttfa_s(client, server, text, True))
                    off.append(ttfa_s(client, server, text, False))
                on_ms, off_ms = statistics.median(on) * 1e3, statistics.median(off) * 1e3
                added.append(on_ms - off_ms)
                print(f"{text[:58]:58} {on_ms:7.1f} {off_ms:8.1f} {on_ms - off_ms:6.1f}")
            print(f"{'median added':58} {'':7} {'':8} {statistics.median(added):6.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
