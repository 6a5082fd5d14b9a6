"""The model runner: runs the batches the scheduler picks, off the event loop, times them, and nothing else.

Each call runs on one of the runner's worker threads. A call the engine stops waiting for (it passed its
deadline: ``engine/core.py``) abandons its worker: the thread is left to finish or hang on its own and exits
when, if ever, the call returns, its result dropped; the next call starts a fresh worker in its place, so the
slot is back at once. Workers are daemon threads of the runner's own rather than a ``ThreadPoolExecutor``'s,
whose threads the interpreter joins at exit: a hung call must not keep the process from stopping.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rtvoice.engine.models.base import StepPayload, Voice


@dataclass(frozen=True)
class BatchOutput:
    results: list[Any]
    seconds: float
    """How long the call held its runner slot."""


@dataclass(frozen=True)
class _Job:
    call: Callable[[], BatchOutput]
    future: asyncio.Future[BatchOutput]
    loop: asyncio.AbstractEventLoop


def _settle(future: asyncio.Future[BatchOutput], result: BatchOutput | None, error: BaseException | None) -> None:
    if future.done():  # cancelled: the engine abandoned the call, and its late result is dropped
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None  # a call that raised nothing returned its output
        future.set_result(result)


class _Worker:
    """One runner thread, taking one call at a time until it is told to stop (``None``)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Exit after the call in hand, if any."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            result, error = None, None
            try:
                result = job.call()
            except BaseException as raised:  # handed to the caller, as an executor would
                error = raised
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            except RuntimeError:
                pass  # the loop has closed: nobody waits for this call any more


class ModelRunner:
    def __init__(self, threads: int, cost_scale: float = 1.0) -> None:
        """``cost_scale`` > 1 holds the slot that many times a call's measured time (a test and benchmark hook
        that plays a slower machine)."""
        self.slots = threads
        self.cost_scale = cost_scale
        self._idle: list[_Worker] = []
        self._abandoned: list[_Worker] = []
        """Workers whose call was abandoned, until that call returns."""
        self._names = itertools.count(1)
        self._closed = False

    async def run(self, voice: Voice, payloads: Sequence[StepPayload], wide: bool = False) -> BatchOutput:
        """One batched call on a worker thread; onnxruntime and torch release the GIL. Cancelling it abandons
        the call: its worker is given up and a fresh one takes the next call. ``wide``: the call has every core of
        the runner (``Voice.run_wide``; the scheduler holds all slots for it)."""
        loop = asyncio.get_running_loop()
        worker = self._idle.pop() if self._idle else _Worker(f"rtvoice-runner-{next(self._names)}")
        future: asyncio.Future[BatchOutput] = loop.create_future()
        worker.submit(_Job(lambda: self.run_now(voice, payloads, wide), future, loop))
        try:
            output = await future
        except asyncio.CancelledError:
            worker.stop()
            self._abandoned = [w for w in self._abandoned if w.thread.is_alive()] + [worker]
            raise
        except BaseException:
            self._release(worker)  # the call raised; the thread is fine
            raise
        self._release(worker)
        return output

    def _release(self, worker: _Worker) -> None:
        if self._closed:
            worker.stop()
        else:
            self._idle.append(worker)

    def run_now(self, voice: Voice, payloads: Sequence[StepPayload], wide: bool = False) -> BatchOutput:
        """The same call in the calling thread."""
        start = time.perf_counter()
        results = voice.run_wide(payloads) if wide else voice.run(payloads)
        seconds = time.perf_counter() - start
        if self.cost_scale > 1:
            time.sleep((self.cost_scale - 1) * seconds)
            seconds = time.perf_counter() - start
        return BatchOutput(results, seconds)

    @property
    def abandoned_threads(self) -> int:
        """Threads still running a call the engine abandoned (a hung model call holds one for as long as it hangs)."""
        return sum(worker.thread.is_alive() for worker in self._abandoned)

    def close(self) -> None:
        """Idle workers exit; a worker in a call exits when it returns (a hung one never does, and, a daemon
        thread, does not hold the process)."""
        self._closed = True
        while self._idle:
            self._idle.pop().stop()
