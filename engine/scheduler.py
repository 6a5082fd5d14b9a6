"""The one scheduler every transport submits to.

It owns the active and waiting streams and decides, each time a runner slot
is free, which model step runs next and which other streams' steps share the
call:

1. streams that owe their first audio go first, oldest first (time to first
   audio) — except streams whose listener is about to run out of audio
   (within ``urgent_margin_ms``), which go before them: a gap is audible;
2. then the stream whose listener runs out of audio soonest (its playback deadline);
3. the head step's batch takes other ready steps with the same batch key, most
   urgent first, up to ``max_batch_size``, the voice's limit for that kind of
   step, and an even share of the ready work per free runner slot.

A stream has at most one step in flight, so its session is never touched by
two threads; a stream that is far ahead of its listener waits (backpressure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

from rtvoice.engine.errors import Overloaded
from rtvoice.engine.metrics import Metrics
from rtvoice.engine.models.base import Step
from rtvoice.engine.runner import ModelRunner
from rtvoice.engine.stream import SpeechStream, StreamState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_active_streams: int = 32
    max_queued_streams: int = 64
    max_batch_size: int = 8
    max_batch_wait_ms: float = 0.0
    urgent_margin_ms: float = 200.0


@dataclass(frozen=True)
class Decision:
    """One scheduling decision, kept for inspection: which streams' steps ran together."""

    kind: str
    stream_ids: tuple[int, ...]


class Scheduler:
    def __init__(self, runner: ModelRunner, limits: Limits, metrics: Metrics) -> None:
        self.runner = runner
        self.limits = limits
        self.metrics = metrics
        self.active: list[SpeechStream] = []
        self.waiting: deque[SpeechStream] = deque()
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self._wake = asyncio.Event()
        self._in_flight = 0
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()

    # -- admission ----------------------------------------------------------------------------------

    def admit(self, stream: SpeechStream) -> None:
        """Take a new stream, or raise Overloaded when both the active set and the queue are full."""
        if len(self.active) < self.limits.max_active_streams:
            self._activate(stream)
        elif len(self.waiting) < self.limits.max_queued_streams:
            self.waiting.append(stream)
        else:
            self.metrics.rejected.inc()
            raise Overloaded(retry_after_s=1)
        self._update_gauges()
        self.wake()

    def _activate(self, stream: SpeechStream) -> None:
        stream.state = StreamState.ACTIVE
        self.active.append(stream)

    def _release_closed(self) -> None:
        for stream in [s for s in self.active if s.closed or s.finished]:
            if not stream.closed:
                stream.finish()
            self.active.remove(stream)
        for stream in [s for s in self.waiting if s.closed]:
            self.waiting.remove(stream)
        while self.waiting and len(self.active) < self.limits.max_active_streams:
            self._activate(self.waiting.popleft())
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.active_streams.set(len(self.active))
        self.metrics.queued_streams.set(len(self.waiting))

    # -- the loop -----------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="rtvoice-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for stream in self.active + list(self.waiting):
            stream.cancel()
        self.active.clear()
        self.waiting.clear()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._schedule()
            except Exception:  # a scheduling bug must not take every stream down with it
                log.exception("scheduler iteration failed")

    async def _schedule(self) -> None:
        self._release_closed()
        while self._in_flight < self.runner.slots:
            batch = self.pick_batch()
            if not batch:
                return
            wait_s = self.limits.max_batch_wait_ms / 1000
            if wait_s > 0 and len(batch) < self.limits.max_batch_size and self._in_flight > 0:
                # Another call is running anyway: a short wait may let more streams join this one.
                await asyncio.sleep(wait_s)
                self._release_closed()
                batch = self.pick_batch()
                if not batch:
                    return
            self._dispatch(batch)

    def pick_batch(self) -> list[tuple[SpeechStream, Step]]:
        """The next call to make: the most urgent ready step and the steps that can share its call."""
        ready: list[tuple[tuple[int, float], SpeechStream, Step]] = []
        now = time.monotonic()
        margin = self.limits.urgent_margin_ms / 1000
        for stream in self.active:
            if stream.in_flight or stream.closed or stream.throttled:
                continue
            step = stream.session.next_step()
            if step is not None:
                ready.append((stream.priority(now, margin), stream, step))
        if not ready:
            return []
        ready.sort(key=lambda item: item[0])
        _, head_stream, head = ready[0]
        compatible = [(stream, step) for _, stream, step in ready if step.batch_key == head.batch_key]
        # Split ready work over the free runner slots rather than queueing it all behind one call.
        free_slots = max(1, self.runner.slots - self._in_flight)
        limit = min(
            self.limits.max_batch_size,
            head_stream.voice.max_batch(head.kind),
            -(-len(compatible) // free_slots),
        )
        return compatible[:limit]

    def _dispatch(self, batch: list[tuple[SpeechStream, Step]]) -> None:
        for stream, _ in batch:
            stream.in_flight = True
        self._in_flight += 1
        kind = batch[0][1].kind
        self.decisions.append(Decision(kind, tuple(stream.id for stream, _ in batch)))
        self.metrics.batch_size.labels(kind).observe(len(batch))
        task = asyncio.get_running_loop().create_task(self._execute(batch))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _execute(self, batch: list[tuple[SpeechStream, Step]]) -> None:
        voice = batch[0][0].voice
        kind = batch[0][1].kind
        try:
            results, seconds = await self.runner.run(voice, kind, [step.payload for _, step in batch])
        except Exception as error:
            log.exception("%s call failed for streams %s", kind, [s.id for s, _ in batch])
            for stream, _ in batch:
                stream.in_flight = False
                stream.fail(error)
        else:
            self.metrics.step_seconds.labels(kind).observe(seconds)
            share = seconds / len(batch)
            for (stream, step), result in zip(batch, results):
                stream.in_flight = False
                if stream.closed:
                    continue  # cancelled while its step ran: drop the result
                try:
                    stream.deliver(step, result, share)
                except Exception as error:
                    log.exception("stream %s failed", stream.id)
                    stream.fail(error)
        finally:
            self._in_flight -= 1
            self.wake()
