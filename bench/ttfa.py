"""Time to first audio and real-time factor over loopback HTTP, next to Piper's own synthesis of the same text.

    python -m bench.ttfa [--runs 20]

rtvoice runs as its own process (``/inference_sft``, raw PCM, so the first body
bytes are audio). In the same run, Piper's Python API (``PiperVoice.synthesize``,
one audio chunk per sentence) and, when ``piper-tts[http]`` is installed,
Piper's HTTP server (one WAV per request) speak the same texts with the same
voice, interleaved: each round times every system once (the order rotating by
round). Figures are p50/p95 over the rounds; a ratio is the median over the
rounds of that round's Piper TTFA / rtvoice TTFA, so the machine's drift within
the run (other processes, CPU boost) cancels out of it.

Each timed request starts after a rest (``--rest-ms``): Piper's onnxruntime
threads spin on after a synthesis (50-60 ms of CPU on a 2-core machine), and a
request timed in that spin shares the cores with it (docs/decisions.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from testkit.servers import Server, start_piper_http, start_rtvoice

TEXTS = {
    "short (10 words)": "The quick brown fox jumps over the lazy dog by the river.",
    "long sentence (~14 s)": (
        "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone expected a "
        "short meeting, but the discussion about the new budget, the delayed construction of the bridge, and the "
        "future of the community garden went on for hours."
    ),
    "paragraph": (
        "Real-time speech is judged by its first word. A listener forgives a voice that pauses to think, but not one "
        "that keeps them waiting before it starts. That is why this server begins to speak while the rest of the "
        "paragraph is still being synthesised. Each sentence is split into chunks, and the first chunk is kept small. "
        "Later chunks grow, because by then the listener already has audio to play."
    ),
}


@dataclass
class Timing:
    ttfa_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    audio_s: float = 0.0

    def p(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ttfa_p50(self) -> float:
        return statistics.median(self.ttfa_s)

    @property
    def ttfa_p95(self) -> float:
        return self.p(self.ttfa_s, 0.95)

    @property
    def rtf(self) -> float:
        return statistics.median(self.total_s) / self.audio_s

    def add(self, ttfa_s: float, total_s: float, audio_s: float) -> None:
        self.ttfa_s.append(ttfa_s)
        self.total_s.append(total_s)
        self.audio_s = audio_s


Once = Callable[[str], tuple[float, float, float]]
"""One synthesis of a text: its time to first audio, its whole time and its audio seconds."""


def rtvoice_once(client: httpx.Client, server: Server) -> Once:
    def once(text: str) -> tuple[float, float, float]:
        start = time.perf_counter()
        first = None
        size = 0
        with client.stream("POST", f"{server.url}/inference_sft", data={"tts_text": text, "format": "pcm"}) as r:
            r.raise_for_status()
            rate = int(r.headers["x-sample-rate"])
            for chunk in r.iter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - start
                size += len(chunk)
        return first or 0.0, time.perf_counter() - start, size / 2 / rate

    return once


def piper_api_once() -> Once:
    from piper import PiperVoice

    from rtvoice.engine.voices import embedded_voice_path

    voice = PiperVoice.load(embedded_voice_path())
    list(voice.synthesize("Warm up."))

    def once(text: str) -> tuple[float, float, float]:
        start = time.perf_counter()
        first = None
        samples = 0
        for chunk in voice.synthesize(text):
            if first is None:
                first = time.perf_counter() - start
            samples += len(chunk.audio_float_array)
        return first or 0.0, time.perf_counter() - start, samples / voice.config.sample_rate

    return once


def piper_http_once(client: httpx.Client, server: Server) -> Once:
    def once(text: str) -> tuple[float, float, float]:
        start = time.perf_counter()
        first = None
        body = b""
        with client.stream("POST", f"{server.url}/synthesize", json={"text": text}) as r:
            r.raise_for_status()
            for chunk in r.iter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - start
                body += chunk
        return first or 0.0, time.perf_counter() - start, (len(body) - 44) / 2 / 22050

    return once


def interleaved(
    systems: dict[str, Once], text: str, runs: int, rest_s: float = 0.0
) -> tuple[dict[str, Timing], dict[str, list[float]]]:
    """``runs`` rounds, each timing every system once on ``text`` (the order rotating by round, after two rounds
    that warm connections and caches) ``rest_s`` after the one before; each system's timings, and each other
    system's per-round TTFA ratio to the first's."""
    names = list(systems)
    timings = {name: Timing() for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}

    def rested(name: str) -> tuple[float, float, float]:
        time.sleep(rest_s)
        return systems[name](text)

    for round_ in range(runs + 2):
        shift = round_ % len(names)
        measured = {name: rested(name) for name in names[shift:] + names[:shift]}
        if round_ < 2:
            continue
        for name, (ttfa_s, total_s, audio_s) in measured.items():
            timings[name].add(ttfa_s, total_s, audio_s)
        ours = measured[names[0]][0]
        for name in names[1:]:
            ratios[name].append(measured[name][0] / ours)
    return timings, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--rest-ms",
        type=float,
        default=250.0,
        help="rest before each timed request, so that none is timed while the last one's threads still spin",
    )
    args = parser.parse_args()

    from rtvoice.engine.voices import embedded_voice_path

    rtvoice = start_rtvoice()
    piper_http = None
    try:
        import flask  # noqa: F401

        piper_http = start_piper_http(embedded_voice_path())
    except ImportError:
        print("piper-tts[http] not installed: Piper's HTTP server is left out")
    rtvoice_client, http_client = httpx.Client(timeout=120), httpx.Client(timeout=120)
    try:
        systems = {"rtvoice HTTP": rtvoice_once(rtvoice_client, rtvoice), "piper API": piper_api_once()}
        if piper_http is not None:
            systems["piper HTTP"] = piper_http_once(http_client, piper_http)
        header = f"{'text':24} {'system':18} {'audio s':>8} {'TTFA p50':>9} {'TTFA p95':>9} {'RTF':>6}"
        print(header)
        print("-" * len(header))
        for label, text in TEXTS.items():
            results, ratios = interleaved(systems, text, args.runs, args.rest_ms / 1e3)
            for system, t in results.items():
                print(
                    f"{label:24} {system:18} {t.audio_s:8.2f} {t.ttfa_p50 * 1e3:7.1f}ms {t.ttfa_p95 * 1e3:7.1f}ms "
                    f"{t.rtf:6.3f}"
                )
            for system, per_round in ratios.items():
                print(
                    f"{'':24} TTFA ratio {system} / rtvoice, median of {len(per_round)} rounds = "
                    f"{statistics.median(per_round):.2f}x (rtvoice / {system}: "
                    f"{statistics.median(1 / r for r in per_round):.2f}x)"
                )
    finally:
        rtvoice_client.close()
        http_client.close()
        rtvoice.stop()
        if piper_http is not None:
            piper_http.stop()


if __name__ == "__main__":
    main()
