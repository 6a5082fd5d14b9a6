"""The LM's decode step at fixed shapes: batch buckets, padding rows, static buffers, and CUDA graphs of it.

A decode call of ``n`` streams runs at the batch bucket at or above ``n`` (``BATCH_BUCKETS``) and attends over the
length bucket at or above its longest stream (powers of two, from the pool's smallest slot length): the rows past
``n`` point at the pool's scratch slot (masked by their own length, 0, so they touch no stream), and every input
lives in one static buffer per batch bucket (the slots, rewritten only when the call's streams change; each row's
uniforms, drawn from its stream's own generator). With ``capture`` (CUDA and ``RTVOICE_COSYVOICE_CUDA_GRAPHS``)
each (batch, length) bucket is captured once as a ``torch.cuda.CUDAGraph`` (at warm-up: ``capture_all``; a bucket
met later, or any after the pool grew, on first use) and replayed; without it, the same bucketed, padded step runs
eagerly (how the CPU tests check this bookkeeping). Calls wider than the last bucket, and greedy ones, run eagerly.

The step (``Qwen2LM.decode_sample``) syncs nothing with the host, so it can be captured; the chosen tokens are the
one transfer back, made here under the lock that guards the static buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .kv_pool import SCRATCH, KVPool, PoolTensors, next_power_of_two

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Decode batch sizes with a captured graph (the scheduler's batches are at most ``max_active_streams``)."""


def batch_bucket(rows: int) -> int | None:
    """The smallest bucket that holds ``rows``; None past the last (such a call runs eagerly)."""
    return next((b for b in BATCH_BUCKETS if b >= rows), None)


def length_bucket(positions: int, floor: int) -> int:
    """The attended length for a call whose longest stream covers ``positions``: a power of two, ``floor`` at least."""
    return next_power_of_two(max(positions, floor))


@dataclass
class _Rows:
    """The static inputs of one batch bucket."""

    slots: torch.Tensor
    uniforms: torch.Tensor
    key: tuple[int, ...] | None = None
    """The slots now in ``slots`` (None: all scratch)."""
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)
    """Length bucket -> the captured step and its output tokens."""


class DecodingLM(Protocol):
    """What the graphs need of the LM (``llm.Qwen2LM``), named here so that this module does not import it."""

    pool: KVPool

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def draws(self) -> int: ...

    def decode_sample(
        self, tensors: PoolTensors, slots: torch.Tensor, length: int, uniforms: torch.Tensor | None
    ) -> torch.Tensor: ...


class DecodeGraphs:
    def __init__(self, lm: DecodingLM, capture: bool) -> None:
        self.lm = lm
        self.capture = capture
        self._rows: dict[int, _Rows] = {}
        self._generation = -1
        self._lock = threading.Lock()  # static buffers are shared by every call of a bucket
        self._mempool: Any = None

    def shapes(self, rows: int, positions: int, tensors: PoolTensors) -> tuple[int, int] | None:
        """(batch bucket, length bucket) of a call of ``rows`` streams whose longest covers ``positions``."""
        batch = batch_bucket(rows)
        if batch is None:
            return None
        return batch, min(length_bucket(positions, self.lm.pool.min_length), tensors.length)

    def run(
        self,
        tensors: PoolTensors,
        slots: Sequence[int],
        positions: int,
        generators: Sequence[torch.Generator] | None,
    ) -> list[int]:
        """One decode step of the streams in ``slots`` (each at most ``positions`` long after it), sampling with
        ``generators`` (greedy without), on the pool's ``tensors`` (the caller's session): the chosen tokens."""
        shapes = self.shapes(len(slots), positions, tensors)
        assert shapes is not None, "a call wider than the last bucket runs eagerly"
        batch, length = shapes
        with self._lock:
            # Graphs hold the tensors they were captured on: a step that entered before the pool grew runs eagerly.
            current = tensors is self.lm.pool.tensors
            if current and tensors.generation != self._generation:
                self._rows.clear()  # graphs and buffers of older tensors
                self._generation = tensors.generation
            rows = self._buffers(batch)
            captured = None
            if self.capture and current and generators is not None:
                captured = rows.graphs.get(length) or self._capture(tensors, rows, length)  # before the slots are set
            key = tuple(slots)
            if rows.key != key:
                # One small copy when the call's streams change; none while the same streams decode.
                padded = list(slots) + [SCRATCH] * (batch - len(slots))
                rows.slots.copy_(torch.tensor(padded, dtype=torch.long))
                rows.key = key
            uniforms = None if generators is None else self._draw(rows, generators)
            if captured is not None:
                graph, tokens = captured
                graph.replay()
            else:
                tokens = self.lm.decode_sample(tensors, rows.slots, length, uniforms)
            return tokens[: len(slots)].tolist()  # the step's one transfer to the host

    @torch.inference_mode()  # the pool's tensors are inference tensors: updated in place only in this mode
    def capture_all(self, positions: int) -> int:
        """Capture every (batch, length) bucket up to ``positions`` (warm-up); the number captured."""
        if not self.capture:
            return 0
        lm, pool = self.lm, self.lm.pool
        pool.reserve(lm.device, lm.dtype, BATCH_BUCKETS[-1], positions)
        captured = 0
        with pool.session(lm.device, lm.dtype) as (_, tensors), self._lock:
            if tensors.generation != self._generation:
                self._rows.clear()
                self._generation = tensors.generation
            length = length_bucket(1, pool.min_length)
            while length <= tensors.length:
                for batch in BATCH_BUCKETS:
                    rows = self._buffers(batch)
                    if length not in rows.graphs:
                        self._capture(tensors, rows, length)
                        captured += 1
                length *= 2
        return captured

    def _buffers(self, batch: int) -> _Rows:
        rows = self._rows.get(batch)
        if rows is None:
            device = self.lm.device
            rows = _Rows(
                slots=torch.full((batch,), SCRATCH, dtype=torch.long, device=device),
                uniforms=torch.full((batch, self.lm.draws), 0.5, device=device),
            )
            self._rows[batch] = rows
        return rows

    def _draw(self, rows: _Rows, generators: Sequence[torch.Generator]) -> torch.Tensor:
        for row, generator in enumerate(generators):
            rows.uniforms[row].uniform_(generator=generator)  # one small op per row, no sync
        return rows.uniforms

    def _capture(self, tensors: PoolTensors, rows: _Rows, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Captured on scratch rows only: the warm-up runs below really execute, and must move no stream.
        rows.slots.fill_(SCRATCH)
        rows.key = None
        if self._mempool is None:
            # One memory pool for every graph: they never run at once (the lock), and each replay's tokens are read
            # before the next replay, which may reuse their memory.
            self._mempool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisation and allocations outside the capture, as torch advises
                self.lm.decode_sample(tensors, rows.slots, length, rows.uniforms)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Thread-local: another runner thread (token-to-wave) may launch work while this one captures.
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            tokens = self.lm.decode_sample(tensors, rows.slots, length, rows.uniforms)
        rows.graphs[length] = (graph, tokens)
        return graph, tokens
