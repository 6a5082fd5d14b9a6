"""The LM's KV cache pool: one tensor on the model's device holding fixed slots, one per active stream.

Layout ``kv[layer, 0 | 1, slot, kv_head, position, head_dim]`` (keys, values). Every slot has the same length, so
a step writes each stream's new keys and values in place (``index_put_`` at its slot and positions) and attends to
its slot directly (one stream: a view) or to the step's slots gathered into one batch; nothing is copied to or
from a stream's own buffer. Beside it, per slot, on the device: the positions filled (``lengths``), the last token
chosen (the next decode input), the tokens made so far and the eos bound (the sampler's ``min_len`` mask), and the
last ``window`` tokens (the repetition-aware sampler's window): a step reads and updates them without the host.

Slot 0 is scratch: the padding rows of a fixed-shape (CUDA-graph) step point at it, so they touch no stream.

The pool grows on demand, in powers of two, in slots (streams at once) and in length (positions per slot, never
past ``max_positions``, the model's limit): so a CPU allocates what it uses, and a GPU reserves what its graphs need
at warm-up. Runner threads may run LM calls side by side, on different slots, so growing never waits for them: a
step works on the tensors it entered with (a :class:`PoolTensors`, one per ``generation``), growing copies every
slot that no step holds into new tensors, and a step that entered before copies its own slots over as it leaves.

A slot goes back to the pool when its stream finishes, or when the stream is garbage-collected (cancelled
requests): ``release`` only queues it (lock-free, so a finalizer may run it on any thread, at any time), and the
next session takes it back.
"""

from __future__ import annotations

import gc
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

SCRATCH = 0
"""The slot padding rows read and write."""


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True, eq=False)
class PoolTensors:
    """One generation of the pool's tensors (a step uses those it entered with)."""

    kv: torch.Tensor
    """[layers, 2, slots, kv_heads, length, head_dim]."""
    lengths: torch.Tensor
    """[slots] positions filled."""
    last_token: torch.Tensor
    """[slots] the last token chosen: the next decode input."""
    n_tokens: torch.Tensor
    """[slots] tokens made so far."""
    min_len: torch.Tensor
    """[slots] eos stays masked while ``n_tokens`` is below it."""
    window: torch.Tensor
    """[slots, window] the last tokens, token k at k % window (-1: none)."""
    generation: int

    @property
    def slots(self) -> int:
        return self.kv.shape[2]

    @property
    def length(self) -> int:
        return self.kv.shape[4]

    def record(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Each row's chosen token: the next decode input, one more made, into the sampler's window (on the device:
        no host sync)."""
        made = self.n_tokens[slots]
        self.window[slots, made % self.window.shape[1]] = tokens
        self.n_tokens[slots] = made + 1
        self.last_token[slots] = tokens

    def start(self, slot: int, tokens: list[int], min_len: int) -> None:
        """A new stream in ``slot`` (at its prefill: host work is fine there)."""
        self.lengths[slot] = 0
        self.n_tokens[slot] = len(tokens)
        self.min_len[slot] = min_len
        self.last_token[slot] = tokens[-1] if tokens else 0
        self.window[slot] = -1
        size = self.window.shape[1]
        recent = tokens[-size:]
        if recent:
            first = len(tokens) - len(recent)  # token k goes to ring position k % size, as ``record`` puts it
            places = torch.tensor([(first + i) % size for i in range(len(recent))], device=self.kv.device)
            self.window[slot, places] = torch.tensor(recent, device=self.kv.device)

    def copy_slots(self, source: PoolTensors, slots: Sequence[int]) -> None:
        """``slots`` as ``source`` holds them (an older, smaller generation) into these tensors."""
        index = torch.tensor(list(slots), device=self.kv.device)
        length = source.length
        self.kv[:, :, :, :, :length].index_copy_(2, index, source.kv.index_select(2, index))
        for name in ("lengths", "last_token", "n_tokens", "min_len", "window"):
            getattr(self, name).index_copy_(0, index, getattr(source, name).index_select(0, index))


class KVPool:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_positions: int, window: int, min_length: int):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.max_positions = max_positions
        """No slot grows past this (the backbone's ``max_position_embeddings``)."""
        self.window_size = max(1, window)
        self.min_length = min(min_length, max_positions)
        """Slot length of a new pool; lengths are powers of two from here."""
        self.tensors: PoolTensors | None = None
        """The current generation (None until the first step)."""
        self._free: list[int] = []
        self._released: deque[int] = deque()  # appended by finalizers without a lock (deque appends are atomic)
        self._cond = threading.Condition()
        self._active = 0
        self._reserved = 0

    # -- the current generation, for callers outside a step (tests, ``LMStream.kv``) ----------------------------

    @property
    def current(self) -> PoolTensors:
        if self.tensors is None:
            raise RuntimeError("the KV pool holds nothing yet")
        return self.tensors

    @property
    def kv(self) -> torch.Tensor:
        return self.current.kv

    @property
    def lengths(self) -> torch.Tensor:
        return self.current.lengths

    @property
    def last_token(self) -> torch.Tensor:
        return self.current.last_token

    @property
    def n_tokens(self) -> torch.Tensor:
        return self.current.n_tokens

    @property
    def min_len(self) -> torch.Tensor:
        return self.current.min_len

    @property
    def window(self) -> torch.Tensor:
        return self.current.window

    @property
    def slots(self) -> int:
        """Slots allocated, scratch included."""
        return 0 if self.tensors is None else self.tensors.slots

    @property
    def length(self) -> int:
        """Positions per slot."""
        return 0 if self.tensors is None else self.tensors.length

    @property
    def generation(self) -> int:
        return -1 if self.tensors is None else self.tensors.generation

    # -- slots ---------------------------------------------------------------------------------------

    def release(self, slot: int) -> None:
        """Give ``slot`` back (taken back at the next session); safe from any thread and from finalizers."""
        self._released.append(slot)

    def _drain(self) -> None:
        while self._released:
            self._free.append(self._released.popleft())

    @property
    def in_use(self) -> int:
        """Slots held by streams (released ones not yet taken back count as free)."""
        return max(0, self.slots - 1 - len(self._free) - len(self._released))

    @contextmanager
    def session(
        self,
        device: torch.device,
        dtype: torch.dtype,
        new: int = 0,
        positions: int = 0,
        held: Sequence[int] = (),
    ) -> Iterator[tuple[list[int], PoolTensors]]:
        """A step's use of the pool: its streams' slots ``held``, ``new`` fresh ones, every slot ``positions`` long at
        least. Yields the fresh slots and the tensors to use; whatever grows meanwhile, the step's slots are carried
        into the current tensors as it leaves."""
        if positions > self.max_positions:
            raise ValueError(f"a stream needs {positions} positions; the model has {self.max_positions}")
        with self._cond:
            self._drain()
            if self._moved(device, dtype):
                while self._active:  # a new device or dtype: nothing may be in flight (never while serving)
                    self._cond.wait()
                if self.in_use:
                    raise RuntimeError("the LM moved to another device or dtype while streams hold KV slots")
                self.tensors, self._free = None, []
            if new > len(self._free) and self._reserved and self.slots >= self._reserved:
                # A stream dropped inside a reference cycle frees its slot only at the cyclic GC: cheaper than
                # growing past what warm-up reserved (a reallocation, and every CUDA graph captured again).
                gc.collect()
                self._drain()
            self._grow(device, dtype, new, positions)
            taken = [self._free.pop() for _ in range(new)]
            mine = [*held, *taken]
            self._active += 1
            tensors = self.current
        try:
            yield taken, tensors
        finally:
            with self._cond:
                if tensors is not self.tensors and mine:
                    self._sync(tensors.kv.device)
                    self.current.copy_slots(tensors, mine)
                    self._sync(tensors.kv.device)
                self._active -= 1
                self._cond.notify_all()

    def reserve(self, device: torch.device, dtype: torch.dtype, slots: int, positions: int) -> None:
        """Grow now (at warm-up) to at least ``slots`` slots besides scratch and ``positions`` positions each."""
        with self._cond:
            self._drain()
            self._grow(device, dtype, 0, min(positions, self.max_positions), slots + 1)
            self._reserved = self.slots

    # -- layout --------------------------------------------------------------------------------------

    def _moved(self, device: torch.device, dtype: torch.dtype) -> bool:
        return self.tensors is not None and (self.tensors.kv.device != device or self.tensors.kv.dtype != dtype)

    def _sync(self, device: torch.device) -> None:
        if device.type == "cuda":
            # Other runner threads' CUDA streams may be writing the old tensors, or about to read the new ones.
            torch.cuda.synchronize(device)

    def _grow(self, device: torch.device, dtype: torch.dtype, new: int, positions: int, slots: int = 0) -> None:
        old = self.tensors
        old_slots, old_length = self.slots, self.length
        in_use = old_slots - 1 - len(self._free) if old else 0
        target_slots = max(old_slots, slots)
        if new > len(self._free) or not old:
            target_slots = max(target_slots, next_power_of_two(in_use + new + 1))
        target_length = old_length
        if positions > old_length or not old:
            target_length = min(self.max_positions, next_power_of_two(max(positions, self.min_length)))
        if old is not None and (target_slots, target_length) == (old_slots, old_length):
            return

        def full(shape: tuple[int, ...], fill: int) -> torch.Tensor:
            return torch.full(shape, fill, dtype=torch.long, device=device)

        kv = torch.zeros(
            self.layers, 2, target_slots, self.kv_heads, target_length, self.head_dim, dtype=dtype, device=device
        )
        grown = PoolTensors(
            kv=kv,
            lengths=full((target_slots,), 0),
            last_token=full((target_slots,), 0),
            n_tokens=full((target_slots,), 0),
            min_len=full((target_slots,), 0),
            window=full((target_slots, self.window_size), -1),
            generation=self.generation + 1,
        )
        if old is not None:
            # Every slot as it is; the slots of steps in flight are stale here and carried over as those steps leave.
            self._sync(device)
            kv[:, :, :old_slots, :, :old_length] = old.kv
            for name in ("lengths", "last_token", "n_tokens", "min_len", "window"):
                getattr(grown, name)[:old_slots] = getattr(old, name)
            self._sync(device)
        self._free.extend(range(max(old_slots, SCRATCH + 1), target_slots))
        self.tensors = grown
