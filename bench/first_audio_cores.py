"""A lone request's first audio on every core against one core, call by call (issue 42's floor for four at once).

    python -m bench.first_audio_cores [--runs 20]

An in-process engine on the default voice speaks the bench's 10-word sentence alone, ``--runs`` times with
``idle_cores_for_first_audio`` on and as many off, the two engines taking turns run by run. Every model call before
the first audio is timed on its runner thread, and the gaps between them. It prints the p50 of each, and the earliest
four first audios at once can end on this machine's cores, run a core each with nothing between them: the one-core
first audio times ceil(4 / cores), over the lone request's first audio on every core.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time

from bench.runner_calls import timed_calls
from bench.ttfa import TEXTS
from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings

TEXT = TEXTS["short (10 words)"]
AT_ONCE = 4


class TimedEngine:
    """An engine whose runner's calls are timed on their thread."""

    def __init__(self, wide: bool) -> None:
        self.engine = Engine(EngineSettings(idle_cores_for_first_audio=wide))
        self.calls = timed_calls(self.engine)

    async def once(self, seed: int) -> dict[str, float]:
        """One lone request: its first audio and, before it, each call and the gap before it (ms)."""
        self.calls.clear()
        sent = time.perf_counter()
        first = None
        request = SynthesisRequest(text=TEXT, options=SynthesisOptions(seed=seed))
        async for _ in self.engine.open_stream(request).audio():
            if first is None:
                first = time.perf_counter()
        assert first is not None
        row = {"first audio": (first - sent) * 1e3}
        before = sent
        for call in (call for call in self.calls if call.start < first):
            row[f"gap before {call.kind}"] = (call.start - before) * 1e3
            row[call.kind] = (call.end - call.start) * 1e3
            before = call.end
        return row


async def measure(runs: int) -> dict[bool, list[dict[str, float]]]:
    engines = {wide: TimedEngine(wide) for wide in (True, False)}
    for timed in engines.values():
        await timed.engine.start()
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        for run in range(runs + 2):
            for wide, timed in engines.items():  # the two take turns, so drift falls on both
                row = await timed.once(seed=run)
                if run >= 2:  # two to warm caches
                    rows[wide].append(row)
                await asyncio.sleep(0.05)
    finally:
        for timed in engines.values():
            await timed.engine.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.runs))
    p50: dict[bool, dict[str, float]] = {}
    for wide, measured in rows.items():
        p50[wide] = {key: statistics.median(row[key] for row in measured if key in row) for key in measured[0]}
        print("every core" if wide else "one core")
        for key, value in p50[wide].items():
            print(f"  {key:20s} p50 {value:7.1f} ms")
    cores = os.cpu_count() or 1
    earliest = math.ceil(AT_ONCE / cores) * p50[False]["first audio"]
    print(
        f"{AT_ONCE} at once on {cores} cores end at {earliest:.0f} ms at the earliest: "
        f"{earliest / p50[True]['first audio']:.2f}x the lone request on every core, "
        f"{earliest / p50[False]['first audio']:.2f}x on one"
    )


if __name__ == "__main__":
    main()
