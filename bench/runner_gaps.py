"""How long a freed runner slot waits for its next call while streams are ready (issue 43's idle runner).

    python -m bench.runner_gaps [--streams 12] [--utterances 3] [--runs 2] [--calibrate]

An in-process engine on the default voice; ``--streams`` clients each ask for ``--utterances`` utterances back to
back and read their audio as fast as it comes. Every model call's start and end are taken on its runner thread;
a gap runs from a call's end to the next call's start on any slot. The first and last tenth of the calls (the ramp
and the tail) are left out. It prints each run's gap p50 and p90 and the mean call.

It also prints how long a stream owing its first audio waited between its calls (its encode, first flow window and
first decode: issue 43's "one job"), from each call's pick to its results applied, as the scheduler saw them.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.runner_calls import timed_calls
from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.runner import BatchOutput
from rtvoice.engine.scheduler import Batch, Scheduler
from rtvoice.engine.settings import EngineSettings

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


@dataclass
class _Picked:
    owes_first_audio: bool
    applied: float | None = None
    """When its results were applied (``time.perf_counter()``)."""


def first_audio_waits(scheduler: Scheduler) -> list[float]:
    """The list that each wait of a stream owing its first audio, from one call's results applied to its next
    call's pick, is appended to as its next call is picked (by ``time.perf_counter()``)."""
    waits: list[float] = []
    calls: dict[int, list[_Picked]] = {}
    pick, complete = scheduler.pick_batch, scheduler.complete

    def picked() -> Batch | None:
        batch = pick()
        now = time.perf_counter()
        for stream, _ in batch.items if batch is not None else ():
            owes = stream.playback.owes_first_audio
            previous = calls.setdefault(stream.id, [])
            if owes and previous and previous[-1].owes_first_audio and previous[-1].applied is not None:
                waits.append(now - previous[-1].applied)
            previous.append(_Picked(owes))
        return batch

    def completed(batch: Batch, output: BatchOutput) -> None:
        now = time.perf_counter()
        for stream, _ in batch.items:
            next(call for call in calls[stream.id] if call.applied is None).applied = now
        complete(batch, output)

    instance: Any = scheduler  # the engine calls them through the instance: seen as it picks and applies
    instance.pick_batch, instance.complete = picked, completed
    return waits


async def measure(streams: int, utterances: int, calibrate: bool = False) -> tuple[list[float], float, list[float]]:
    """The gaps (s), the mean call (s) and the waits between a first audio's calls (s) of one run; ``calibrate``:
    the engine measures its costs at start (its warm-up), as a server does."""
    engine = Engine(EngineSettings(warmup=calibrate))
    await engine.start()
    calls = timed_calls(engine)
    waits = first_audio_waits(engine.scheduler)

    async def client(index: int) -> None:
        for n in range(utterances):
            request = SynthesisRequest(text=TEXT, options=SynthesisOptions(seed=index * utterances + n))
            async for _ in engine.open_stream(request).audio():
                pass

    try:
        await asyncio.gather(*(client(i) for i in range(streams)))
    finally:
        await engine.stop()
    starts = sorted(call.start for call in calls)
    ends = sorted(call.end for call in calls)
    tenth = len(ends) // 10
    gaps = []
    for end in ends[tenth : len(ends) - tenth]:
        following = bisect.bisect_left(starts, end)
        if following < len(starts):
            gaps.append(starts[following] - end)
    return sorted(gaps), statistics.mean(call.end - call.start for call in calls), sorted(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--utterances", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="calibrate costs at start, as a server does, so that admission queues newcomers past capacity",
    )
    args = parser.parse_args()
    for run in range(args.runs):
        gaps, call_s, waits = asyncio.run(measure(args.streams, args.utterances, args.calibrate))
        p50, p90 = statistics.median(gaps), gaps[int(0.9 * (len(gaps) - 1))]
        print(f"run {run + 1}: gap p50 {p50 * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms, mean call {call_s * 1e3:.1f} ms")
        long = sum(wait > 0.01 for wait in waits)
        print(
            f"  first audio, between its calls: {len(waits)} waits, p50 {statistics.median(waits) * 1e3:.2f} ms, "
            f"p90 {waits[int(0.9 * (len(waits) - 1))] * 1e3:.2f} ms, over 10 ms {long}, "
            f"longest {waits[-1] * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
