"""The model runner: runs the batches the scheduler picks, off the event loop, and nothing else."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rtvoice.engine.models.base import Voice


class ModelRunner:
    def __init__(self, threads: int) -> None:
        self.slots = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rtvoice-runner")

    async def run(self, voice: Voice, kind: str, payloads: list[Any]) -> tuple[list[Any], float]:
        """Results of one batched call and the seconds it took; onnxruntime and torch release the GIL."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _timed, voice, kind, payloads)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _timed(voice: Voice, kind: str, payloads: list[Any]) -> tuple[list[Any], float]:
    start = time.perf_counter()
    results = voice.run(kind, payloads)
    return results, time.perf_counter() - start
