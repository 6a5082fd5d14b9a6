"""How long a freed runner slot waits for its next call while streams are ready (issue 43's idle runner).

    python -m bench.runner_gaps [--streams 12] [--utterances 3] [--runs 2]

An in-process engine on the default voice; ``--streams`` clients each ask for ``--utterances`` utterances back to
back and read their audio as fast as it comes. Every model call's start and end are taken on its runner thread;
a gap runs from a call's end to the next call's start on any slot. The first and last tenth of the calls (the ramp
and the tail) are left out. It prints each run's gap p50 and p90 and the mean call.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics

from bench.runner_calls import timed_calls
from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


async def measure(streams: int, utterances: int) -> tuple[list[float], float]:
    """The gaps (s) and the mean call (s) of one run."""
    engine = Engine(EngineSettings(warmup=False))
    await engine.start()
    calls = timed_calls(engine)

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
    return sorted(gaps), statistics.mean(call.end - call.start for call in calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--utterances", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for run in range(args.runs):
        gaps, call_s = asyncio.run(measure(args.streams, args.utterances))
        p50, p90 = statistics.median(gaps), gaps[int(0.9 * (len(gaps) - 1))]
        print(f"run {run + 1}: gap p50 {p50 * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms, mean call {call_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
