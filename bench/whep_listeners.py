"""Concurrent WHEP listeners: server CPU per listener, text to first audio, and where playback starts to stall.

    python -m bench.whep_listeners [--levels 1 4 8 12 16 24] [--url http://127.0.0.1:8000 --pid PID]

At each level N aiortc players connect over WHEP (recvonly Opus, DataChannel),
each has a short sentence spoken (a session's media starts with its first text),
listen to silence for a few seconds (the idle cost between utterances), then all
send the same paragraph at once and listen until the server says ``done``.
Reported per level:

- server CPU seconds per listener per second of audio (``/proc/PID/stat``), and per
  listener-second of silence while idle (less the server's CPU with no session);
- text sent -> first audible frame at the player, p50/p95 (and the server's own
  ``ttfa_ms``: request in -> first frame handed to the RTP sender);
- stalls: silence the server had to send inside an utterance because its audio was
  not ready (underruns; the engine's own estimate of the same is "engine stall"),
  frames its RTP sender pulled over 60 ms late (event loop behind), and gaps of over
  100 ms between frames arriving at a player.

The players run in this process, on the same cores as the server; their CPU is
reported too. "Holds" is the largest level with no late frame, no arrival gap and
underrun silence under 1% of the audio. ``--stagger`` spreads the requests (all at
once by default, the worst case for first audio).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from itertools import pairwise

import httpx

from testkit.servers import Server, metrics, start_rtvoice
from testkit.whep_client import WhepPlayer

PARAGRAPH = (
    "Thanks for calling. Your order left our warehouse this morning, and it should arrive on Thursday between nine "
    "and eleven. If that time does not suit you, I can move the delivery to Friday afternoon instead."
)
IDLE_S = 3.0
GAP_S = 0.1
UNDERRUN_TOLERANCE = 0.01
CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, waited_children: bool = False) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc (Linux); with ``waited_children``, those
    of the children it has waited for too."""
    with open(f"/proc/{pid}/stat") as f:
        fields = [int(value) for value in f.read().rsplit(")", 1)[1].split()[11:15]]
    return sum(fields if waited_children else fields[:2]) / CLK_TCK


def own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Level:
    listeners: int
    idle_cpu: float
    cpu_per_audio_s: float
    client_cpu_per_audio_s: float
    ttfa_p50: float
    ttfa_p95: float
    server_ttfa_p50: float
    server_ttfa_p95: float
    audio_s: float
    wall_s: float
    underrun_s: float
    engine_stall_s: float
    late_frames: float
    gaps: int
    errors: int

    @property
    def holds(self) -> bool:
        """No errors, no late frames, no arrival gaps, and under 1% of the audio made up of underrun silence."""
        return (
            self.errors == 0
            and self.late_frames == 0
            and self.gaps == 0
            and self.underrun_s <= UNDERRUN_TOLERANCE * self.audio_s
        )


def server_metrics(url: str) -> dict[str, float]:
    wanted = ("rtvoice_whep_underrun_seconds_total", "rtvoice_whep_late_frames_total", "rtvoice_stall_seconds_total")
    return metrics(url, wanted)


def arrival_gaps(player: WhepPlayer, start: float, end: float) -> int:
    times = [f.at for f in player.frames if start <= f.at <= end]
    return sum(1 for a, b in pairwise(times) if b - a > GAP_S)


async def run_level(url: str, pid: int, n: int, text: str, stagger_s: float) -> Level:
    async with httpx.AsyncClient(timeout=60) as http:
        cpu0 = process_cpu_s(pid)
        await asyncio.sleep(IDLE_S)
        baseline = process_cpu_s(pid) - cpu0  # the server with no session
        players = [WhepPlayer(url, http=http) for _ in range(n)]
        try:
            for i in range(0, n, 8):
                await asyncio.gather(*(p.start(timeout=30) for p in players[i : i + 8]))
            for player in players:  # media starts with the first text: listen after one, between utterances
                player.send({"type": "tts_request", "text": "Hello.", "request_id": "warm"})
            await asyncio.gather(*(p.event("done", "warm", timeout=60) for p in players))
            await asyncio.sleep(1.0)
            cpu0 = process_cpu_s(pid)
            await asyncio.sleep(IDLE_S)
            idle_cpu = max(0.0, process_cpu_s(pid) - cpu0 - baseline) / (n * IDLE_S)

            before = server_metrics(url)
            cpu1, own1, wall1 = process_cpu_s(pid), own_cpu_s(), time.monotonic()
            sent = []
            for i, player in enumerate(players):
                if stagger_s and i:
                    await asyncio.sleep(stagger_s / n)
                sent.append(player.send({"type": "tts_request", "text": text, "request_id": "para"}))
            results = await asyncio.gather(
                *(p.event("done", "para", timeout=120) for p in players), return_exceptions=True
            )
            cpu2, own2, wall2 = process_cpu_s(pid), own_cpu_s(), time.monotonic()
            after = server_metrics(url)
            await asyncio.sleep(0.3)

            dones = [r for r in results if isinstance(r, dict)]
            audio_s = sum(d["audio_s"] for d in dones)
            ttfa, server_ttfa, gaps = [], [], 0
            for player, t in zip(players, sent, strict=True):
                frame = player.first_speech_after(t)
                if frame is not None:
                    ttfa.append(frame.at - t)
                start_event = next(
                    (e for e in player.events if e.get("type") == "audio_start" and e.get("request_id") == "para"), None
                )
                if start_event is not None:
                    server_ttfa.append(start_event["ttfa_ms"] / 1000)
                    speech_start = frame.at if frame is not None else t
                    gaps += arrival_gaps(player, speech_start, wall2)
            return Level(
                listeners=n,
                idle_cpu=idle_cpu,
                cpu_per_audio_s=(cpu2 - cpu1) / audio_s if audio_s else float("nan"),
                client_cpu_per_audio_s=(own2 - own1) / audio_s if audio_s else float("nan"),
                ttfa_p50=statistics.median(ttfa) if ttfa else float("nan"),
                ttfa_p95=percentile(ttfa, 0.95),
                server_ttfa_p50=statistics.median(server_ttfa) if server_ttfa else float("nan"),
                server_ttfa_p95=percentile(server_ttfa, 0.95),
                audio_s=audio_s,
                wall_s=wall2 - wall1,
                underrun_s=after["rtvoice_whep_underrun_seconds_total"] - before["rtvoice_whep_underrun_seconds_total"],
                engine_stall_s=after["rtvoice_stall_seconds_total"] - before["rtvoice_stall_seconds_total"],
                late_frames=after["rtvoice_whep_late_frames_total"] - before["rtvoice_whep_late_frames_total"],
                gaps=gaps,
                errors=n - len(dones),
            )
        finally:
            await asyncio.gather(*(p.close() for p in players), return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24])
    parser.add_argument("--url", help="an rtvoice server already running (default: start one)")
    parser.add_argument("--pid", type=int, help="its process id, for CPU figures (with --url)")
    parser.add_argument("--text", default=PARAGRAPH)
    parser.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="spread the N requests over this many seconds (0: all at once, the worst case)",
    )
    args = parser.parse_args()

    server: Server | None = None
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        server = start_rtvoice({"RTVOICE_WHEP_MAX_SESSIONS": str(max(args.levels) + 8)})
        url, pid = server.url, server.process.pid
    print(
        f"server {url} (pid {pid}), {os.cpu_count()} CPUs shared by server and players; "
        f"requests {'all at once' if not args.stagger else f'spread over {args.stagger:g} s'}\n"
    )
    header = (
        f"{'N':>3} {'CPU/listener/audio-s':>21} {'idle CPU/listener-s':>20} {'players CPU/audio-s':>20} "
        f"{'TTFA p50/p95 (player)':>22} {'TTFA p50/p95 (server)':>22} {'underrun s':>10} {'engine stall s':>14} "
        f"{'late frames':>11} {'gaps':>5} {'errors':>6}"
    )
    print(header)
    levels: list[Level] = []
    try:
        asyncio.run(run_level(url, pid, 1, "A first utterance warms the server up.", 0.0))  # one-time costs
        for n in args.levels:
            level = asyncio.run(run_level(url, pid, n, args.text, args.stagger))
            levels.append(level)
            print(
                f"{n:>3} {level.cpu_per_audio_s:>21.4f} {level.idle_cpu:>20.4f} "
                f"{level.client_cpu_per_audio_s:>20.4f} "
                f"{level.ttfa_p50 * 1000:>11.0f}/{level.ttfa_p95 * 1000:<4.0f} ms "
                f"{level.server_ttfa_p50 * 1000:>11.0f}/{level.server_ttfa_p95 * 1000:<4.0f} ms "
                f"{level.underrun_s:>10.2f} {level.engine_stall_s:>14.2f} {level.late_frames:>11.0f} "
                f"{level.gaps:>5} {level.errors:>6}",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
    held = [lv.listeners for lv in levels if lv.holds]
    if levels:
        print(
            f"\nheld without stalls (no late frames, no gaps, underrun under {UNDERRUN_TOLERANCE:.0%} of the "
            f"audio): {max(held) if held else 0} listeners, each speaking "
            f"{levels[0].audio_s / levels[0].listeners:.1f} s of audio"
        )


if __name__ == "__main__":
    main()
