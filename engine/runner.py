"""The model runner: runs the batches the scheduler picks, off the event loop, times them, and nothing else."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rtvoice.engine.models.base import StepPayload, Voice


@dataclass(frozen=True)
class BatchOutput:
    results: list[Any]
    seconds: float
    """How long the call held its runner slot."""


class ModelRunner:
    def __init__(self, threads: int, cost_scale: float = 1.0) -> None:
        """``cost_scale`` > 1 holds the slot that many times a call's measured time (a test and benchmark hook
        that plays a slower machine)."""
        self.slots = threads
        self.cost_scale = cost_scale
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rtvoice-runner")

    async def run(self, voice: Voice, payloads: Sequence[StepPayload]) -> BatchOutput:
        """One batched call; onnxruntime and torch release the GIL."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run_now, voice, payloads)

    def run_now(self, voice: Voice, payloads: Sequence[StepPayload]) -> BatchOutput:
        """The same call in the calling thread."""
        start = time.perf_counter()
        results = voice.run(payloads)
        seconds = time.perf_counter() - start
        if self.cost_scale > 1:
            time.sleep((self.cost_scale - 1) * seconds)
            seconds = time.perf_counter() - start
        return BatchOutput(results, seconds)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
