"""Time to first audio and real-time factor over loopback HTTP, next to Piper's own synthesis of the same text.

    python -m bench.ttfa [--runs 20]

rtvoice runs as its own process (``/inference_sft``, raw PCM, so the first body
bytes are audio). In the same run, Piper's Python API (``PiperVoice.synthesize``,
one audio chunk per sentence) and, when ``piper-tts[http]`` is installed,
Piper's HTTP server (one WAV per request) speak the same texts with the same
voice. Figures are p50/p95 over the runs; ratios are Piper / rtvoice.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

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
    ttfa_s: list[float]
    total_s: list[float]
    audio_s: float

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


def time_rtvoice(server: Server, text: str, runs: int) -> Timing:
    ttfa, total, audio_bytes = [], [], 0
    with httpx.Client(timeout=120) as client:
        for _ in range(runs + 2):
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
            ttfa.append(first or 0.0)
            total.append(time.perf_counter() - start)
            audio_bytes = size
    # The first two runs warm connection and caches.
    return Timing(ttfa[2:], total[2:], audio_bytes / 2 / rate)


def time_piper_api(text: str, runs: int) -> Timing:
    from piper import PiperVoice

    from rtvoice.engine.voices import embedded_voice_path

    voice = PiperVoice.load(embedded_voice_path())
    list(voice.synthesize("Warm up."))
    ttfa, total, samples = [], [], 0
    for _ in range(runs):
        start = time.perf_counter()
        first = None
        samples = 0
        for chunk in voice.synthesize(text):
            if first is None:
                first = time.perf_counter() - start
            samples += len(chunk.audio_float_array)
        ttfa.append(first or 0.0)
        total.append(time.perf_counter() - start)
    return Timing(ttfa, total, samples / voice.config.sample_rate)


def time_piper_http(server: Server, text: str, runs: int) -> Timing:
    ttfa, total, audio_s = [], [], 0.0
    with httpx.Client(timeout=120) as client:
        for _ in range(runs + 2):
            start = time.perf_counter()
            first = None
            body = b""
            with client.stream("POST", f"{server.url}/synthesize", json={"text": text}) as r:
                r.raise_for_status()
                for chunk in r.iter_bytes():
                    if chunk and first is None:
                        first = time.perf_counter() - start
                    body += chunk
            ttfa.append(first or 0.0)
            total.append(time.perf_counter() - start)
            audio_s = (len(body) - 44) / 2 / 22050
    return Timing(ttfa[2:], total[2:], audio_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    from rtvoice.engine.voices import embedded_voice_path

    rtvoice = start_rtvoice()
    piper_http = None
    try:
        import flask  # noqa: F401

        piper_http = start_piper_http(embedded_voice_path())
    except ImportError:
        print("piper-tts[http] not installed: Piper's HTTP server is left out")
    try:
        header = f"{'text':24} {'system':18} {'audio s':>8} {'TTFA p50':>9} {'TTFA p95':>9} {'RTF':>6}"
        print(header)
        print("-" * len(header))
        for label, text in TEXTS.items():
            results = {
                "rtvoice HTTP": time_rtvoice(rtvoice, text, args.runs),
                "piper API": time_piper_api(text, args.runs),
            }
            if piper_http is not None:
                results["piper HTTP"] = time_piper_http(piper_http, text, args.runs)
            for system, t in results.items():
                print(
                    f"{label:24} {system:18} {t.audio_s:8.2f} {t.ttfa_p50 * 1e3:7.1f}ms {t.ttfa_p95 * 1e3:7.1f}ms "
                    f"{t.rtf:6.3f}"
                )
            ours = results["rtvoice HTTP"]
            for system, t in results.items():
                if system != "rtvoice HTTP":
                    print(f"{'':24} TTFA p50 ratio {system} / rtvoice = {t.ttfa_p50 / ours.ttfa_p50:.1f}x")
    finally:
        rtvoice.stop()
        if piper_http is not None:
            piper_http.stop()


if __name__ == "__main__":
    main()
