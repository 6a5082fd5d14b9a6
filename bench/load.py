"""Concurrent real-time listeners against one server: TTFA, stalls, throughput; batching on vs off; vs Piper.

    python -m bench.load [--levels 1 4 8 16 32] [--utterances 2]

Each simulated listener plays audio in real time from the first byte. It asks for
an utterance, plays it as it arrives (a stall is time the player waits with an
empty buffer, counted when over 20 ms), and asks for the next one when playback
ends. Listeners join one by one over the first second (``--join-seconds``). For each level it prints TTFA
p50/p95, listeners that stalled and total stall seconds, audio seconds delivered
per wall second, and errors (anything but audio; 503s are counted apart). "later p95" is the TTFA p95 of
the utterances after each listener's first, once the join burst is over.

In the same run the same load goes to rtvoice with batching off
(``RTVOICE_MAX_BATCH_SIZE=1``), and, when ``piper-tts[http]`` is installed, to
Piper's own HTTP server with the same voice (one WAV per request).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from bench.servers import Server, start_piper_http, start_rtvoice

UTTERANCES = [
    "Thanks for calling. I can help you change your booking, check the status of an order, or answer a question "
    "about your account.",
    "Your order left our warehouse this morning, and it should arrive on Thursday between nine and eleven.",
    "If that time does not suit you, I can move the delivery to Friday afternoon instead. Would you like that?",
    "One moment while I look that up for you. It seems the card on file expired last month.",
]
STALL_THRESHOLD_S = 0.02


@dataclass
class Listener:
    ttfa_s: list[float] = field(default_factory=list)
    """Time to first audio of each utterance; the first one is asked for while all listeners join."""
    stall_s: float = 0.0
    stalls: int = 0
    audio_s: float = 0.0
    errors: int = 0
    rejected: int = 0


@dataclass
class Target:
    name: str
    url: str
    kind: str  # "rtvoice" or "piper"

    def request(self, client: httpx.AsyncClient, text: str):  # type: ignore[no-untyped-def]
        if self.kind == "rtvoice":
            return client.stream("POST", f"{self.url}/inference_sft", data={"tts_text": text, "format": "pcm"})
        return client.stream("POST", f"{self.url}/synthesize", json={"text": text})


async def listen(target: Target, index: int, level: int, utterances: int, listener: Listener,
                 join_s: float) -> None:
    await asyncio.sleep(join_s * index / level)  # listeners join one by one over join_s
    async with httpx.AsyncClient(timeout=120) as client:
        for n in range(utterances):
            text = UTTERANCES[(index + n) % len(UTTERANCES)]
            start = time.perf_counter()
            runs_out_at: float | None = None
            header = 44 if target.kind == "piper" else 0
            try:
                async with target.request(client, text) as response:
                    if response.status_code == 503:
                        listener.rejected += 1
                        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                        continue
                    if response.status_code != 200:
                        listener.errors += 1
                        continue
                    rate = int(response.headers.get("x-sample-rate", "22050"))
                    async for chunk in response.aiter_bytes():
                        if header:
                            skip = min(header, len(chunk))
                            chunk, header = chunk[skip:], header - skip
                        if not chunk:
                            continue
                        now = time.perf_counter()
                        seconds = len(chunk) / 2 / rate
                        if runs_out_at is None:
                            listener.ttfa_s.append(now - start)
                            runs_out_at = now
                        elif now > runs_out_at:
                            if now - runs_out_at > STALL_THRESHOLD_S:
                                listener.stalls += 1
                                listener.stall_s += now - runs_out_at
                            runs_out_at = now
                        runs_out_at += seconds
                        listener.audio_s += seconds
            except httpx.HTTPError:
                listener.errors += 1
                continue
            if runs_out_at is not None:
                await asyncio.sleep(max(0.0, runs_out_at - time.perf_counter()))  # play to the end


@dataclass
class LevelResult:
    level: int
    ttfa_p50: float
    ttfa_p95: float
    later_ttfa_p95: float
    """TTFA p95 of the utterances after each listener's first (past the join burst)."""
    stalled: int
    stall_s: float
    audio_per_s: float
    errors: int
    rejected: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_level(target: Target, level: int, utterances: int, join_s: float = 1.0) -> LevelResult:
    listeners = [Listener() for _ in range(level)]
    start = time.perf_counter()
    await asyncio.gather(*(listen(target, i, level, utterances, listeners[i], join_s) for i in range(level)))
    wall = time.perf_counter() - start
    ttfa = [t for listener in listeners for t in listener.ttfa_s]
    return LevelResult(
        level=level,
        ttfa_p50=statistics.median(ttfa) if ttfa else float("nan"),
        ttfa_p95=percentile(ttfa, 0.95),
        later_ttfa_p95=percentile([t for listener in listeners for t in listener.ttfa_s[1:]], 0.95),
        stalled=sum(1 for listener in listeners if listener.stalls),
        stall_s=sum(listener.stall_s for listener in listeners),
        audio_per_s=sum(listener.audio_s for listener in listeners) / wall,
        errors=sum(listener.errors for listener in listeners),
        rejected=sum(listener.rejected for listener in listeners),
    )


def print_table(name: str, results: list[LevelResult]) -> None:
    print(f"\n{name}")
    print(f"{'listeners':>9} {'TTFA p50':>9} {'TTFA p95':>9} {'later p95':>9} {'stalled':>8} {'stall s':>8} "
          f"{'audio s/s':>9} {'errors':>6} {'503s':>5}")
    for r in results:
        print(f"{r.level:9d} {r.ttfa_p50 * 1e3:7.0f}ms {r.ttfa_p95 * 1e3:7.0f}ms {r.later_ttfa_p95 * 1e3:7.0f}ms "
              f"{r.stalled:8d} {r.stall_s:8.2f} {r.audio_per_s:9.2f} {r.errors:6d} {r.rejected:5d}")


async def measure(target: Target, levels: list[int], utterances: int, join_s: float) -> list[LevelResult]:
    await run_level(target, 2, 1)  # warm connections and caches
    results = []
    for level in levels:
        results.append(await run_level(target, level, utterances, join_s))
    print_table(target.name, results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--utterances", type=int, default=2, help="utterances each listener plays")
    parser.add_argument("--join-seconds", type=float, default=1.0, help="listeners join one by one over this time")
    parser.add_argument("--env", nargs="*", default=[], help="extra RTVOICE_X=Y settings for both rtvoice runs")
    parser.add_argument("--no-piper", action="store_true")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)

    runs: dict[str, list[LevelResult]] = {}
    for name, extra in (("rtvoice, batching on", {}), ("rtvoice, batching off", {"RTVOICE_MAX_BATCH_SIZE": "1"})):
        server = start_rtvoice({**env, **extra})
        try:
            runs[name] = asyncio.run(measure(Target(name, server.url, "rtvoice"), args.levels, args.utterances,
                                             args.join_seconds))
        finally:
            server.stop()
    piper: Server | None = None
    if not args.no_piper:
        try:
            import flask  # noqa: F401

            from rtvoice.engine.voices import embedded_voice_path

            piper = start_piper_http(embedded_voice_path())
        except ImportError:
            print("\npiper-tts[http] not installed: Piper's HTTP server is left out")
    if piper is not None:
        try:
            runs["piper HTTP"] = asyncio.run(measure(Target("Piper HTTP server", piper.url, "piper"), args.levels,
                                                     args.utterances, args.join_seconds))
        finally:
            piper.stop()

    on, off = runs["rtvoice, batching on"], runs["rtvoice, batching off"]
    print("\nbatching on / off (audio s per wall s; TTFA p95):")
    for a, b in zip(on, off):
        print(f"  {a.level:3d} listeners: throughput {a.audio_per_s / b.audio_per_s:5.2f}x, "
              f"TTFA p95 {a.ttfa_p95 * 1e3:5.0f} vs {b.ttfa_p95 * 1e3:5.0f} ms")
    if "piper HTTP" in runs:
        print("\nPiper HTTP / rtvoice TTFA p50:")
        for a, p in zip(on, runs["piper HTTP"]):
            print(f"  {a.level:3d} listeners: {p.ttfa_p50 / a.ttfa_p50:5.1f}x")


if __name__ == "__main__":
    main()
