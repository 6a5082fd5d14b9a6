"""The chunk plan of a Piper segment: which flow window or decoder chunk comes next, and how large.

A segment's frames go through the flow in windows and through the decoder in chunks; each window
and chunk carries context frames on both sides, so larger ones pay that context (and the call's
fixed cost) more rarely. The plan takes the largest window or chunk that fits the scheduler's
budget, which comes from costs measured on this machine: the call must not hold its runner slot
for longer than other listeners can wait, and this stream's next audio must come before its own
listener runs out. A stream that still owes its first audio always takes the smallest first chunk.

Frames are counted in the voice's hop (one latent frame per ``hop`` samples). Nothing here runs a
model, so the fake voice of the scheduler tests plans with the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rtvoice.engine.models.base import CostEstimate, StartCost, StepBudget, still_starting

RAMP_GROWTH = 1.5
"""Chunks must be able to grow at least this much from the first one on, or a stream never gets ahead."""
FIRST_CHUNK_SHARE_OF_ROUND = 0.5
"""Under load a first chunk covers this share of a round of the machine (the time it needs to serve every
stream once at the largest chunk: load × that chunk), so a newcomer is soon past its start; idle, the first
chunk stays at ``first_chunk_ms`` (docs/decisions.md)."""
STARTING_FLOW_CHUNKS = 2
"""Full-size chunks whose latent a starting stream's flow window covers. One is what its start needs; the second
halves how often a stream that stays short of a round pays the flow's context (docs/decisions.md)."""


LEAST_CHUNKS_KEPT = 8
"""Estimates whose least chunk a planner keeps (two per turn of the engine: with every slot busy, and lately)."""


@dataclass(frozen=True)
class ChunkPlan:
    """Sizes in milliseconds of audio, from the settings; the voice converts them to frames."""

    first_chunk_ms: int = 120
    chunk_ms: int = 1000
    """The largest decoder chunk."""
    flow_chunk_ms: int = 3000
    """The largest flow window."""
    crossfade_ms: float = 12.0

    def first_chunk_frames(self, frame_ms: float) -> int:
        """The first chunk in frames of ``frame_ms``: the smallest chunk the plan makes."""
        return max(1, round(self.first_chunk_ms / frame_ms))


@dataclass(frozen=True)
class Geometry:
    """One voice's plan in frames."""

    first_chunk: int
    max_chunk: int
    max_window: int
    overlap: int
    """Frames neighbouring chunks share (joined with a cross-fade)."""
    flow_context: int
    decoder_context: int
    frame_s: float
    """Seconds of audio per frame."""

    @property
    def max_chunk_s(self) -> float:
        """Audio of the largest decoder chunk (a round of the machine is load × this)."""
        return self.max_chunk * self.frame_s

    @classmethod
    def of(cls, plan: ChunkPlan, frame_ms: float, flow_context: int, decoder_context: int) -> Geometry:
        first = plan.first_chunk_frames(frame_ms)
        largest = max(first, round(plan.chunk_ms / frame_ms))
        return cls(
            first_chunk=first,
            max_chunk=largest,
            max_window=max(largest, round(plan.flow_chunk_ms / frame_ms)),
            overlap=max(1, round(plan.crossfade_ms / frame_ms)) if plan.crossfade_ms > 0 else 0,
            flow_context=flow_context,
            decoder_context=decoder_context,
            frame_s=frame_ms / 1000,
        )


@dataclass(frozen=True)
class Progress:
    """How far one segment got."""

    frames: int
    flowed: int
    """Latent frames made so far."""
    decoded: int
    """Frames whose audio is final."""


@dataclass(frozen=True)
class Span:
    """One model call's frames: what it reads (context included) and the frames it makes final."""

    lo: int
    """First frame read (left context included)."""
    hi: int
    """End of the frames read (right context, and for a chunk its cross-fade tail, included)."""
    start: int
    """First frame it makes final (latent for a flow window, audio for a decoder chunk)."""
    end: int
    """End of the frames it makes final."""

    kind = ""

    @property
    def size(self) -> int:
        """Frames read: what the call's cost grows with."""
        return self.hi - self.lo


class FlowWindow(Span):
    kind = "flow"


class DecodeChunk(Span):
    kind = "decode"


class Planner:
    def __init__(self, geometry: Geometry) -> None:
        self.g = geometry
        self._least: dict[tuple[CostEstimate, float], int] = {}
        """``least_chunk`` by estimate and margin: admission asks it of every stream at every turn of the engine,
        with the same estimates until the next call is measured (a pure function's results, not any stream's)."""

    # -- shapes -------------------------------------------------------------------------------------

    def latent_needed(self, p: Progress, end: int) -> int:
        """Latent frames a chunk ending at ``end`` needs: its cross-fade tail and the decoder's context."""
        return min(p.frames, end + self.g.overlap + self.g.decoder_context)

    def chunk(self, p: Progress, end: int) -> DecodeChunk:
        return DecodeChunk(max(0, p.decoded - self.g.decoder_context), self.latent_needed(p, end), p.decoded, end)

    def window(self, p: Progress, end: int) -> FlowWindow:
        return FlowWindow(
            max(0, p.flowed - self.g.flow_context), min(p.frames, end + self.g.flow_context), p.flowed, end
        )

    def chunk_end(self, p: Progress, frames: int) -> int:
        """End of a chunk of ``frames``; a remainder under half of it joins it (when its latent is there)
        rather than paying a call."""
        end = min(p.frames, p.decoded + frames)
        if p.frames - end < frames // 2 and (p.flowed >= p.frames or p.flowed == 0):
            end = p.frames
        return end

    def window_end(self, p: Progress, frames: int) -> int:
        """End of a flow window of ``frames``; a short remainder joins it rather than paying the context again."""
        end = min(p.frames, p.flowed + frames)
        if p.frames - end < frames // 2:
            end = p.frames
        return end

    def first_chunk_size(self) -> int:
        """Latent frames of a segment's smallest first chunk (for estimates before the segment is encoded)."""
        return self.g.first_chunk + self.g.overlap + self.g.decoder_context

    def first_window_size(self) -> int:
        return self.g.first_chunk + self.g.overlap + self.g.decoder_context + self.g.flow_context

    def chunk_size(self, frames: int) -> int:
        """Latent frames a decoder chunk of ``frames`` reads inside a segment: its cross-fade tail, and the
        decoder's context on both sides."""
        return frames + self.g.overlap + 2 * self.g.decoder_context

    def window_size(self, frames: int) -> int:
        """Frames a flow window that makes ``frames`` latent frames reads inside a segment: the flow's context on
        both sides."""
        return frames + 2 * self.g.flow_context

    def chunk_cost(self, cost: CostEstimate, frames: int) -> float:
        """Seconds to make a chunk of ``frames`` inside a segment with a flow window of its own (the latent it needs:
        its frames, cross-fade tail and the decoder's right context)."""
        g = self.g
        flow = cost("flow", self.window_size(frames + g.overlap + g.decoder_context))
        return flow + cost("decode", self.chunk_size(frames))

    def least_chunk(self, budget: StepBudget) -> int:
        """Frames of the smallest chunk (a first one, or one under pressure): the configured first chunk, or
        more where the machine is too slow to grow from it.

        A stream grows its chunks only if each chunk's audio lasts longer than making the next, larger one
        (its flow window and its decode, with the safety factor); the first chunk is the smallest size from
        which they can grow by ``RAMP_GROWTH`` (the largest when none can: the machine is that slow).
        """
        try:
            memo_key = (budget.cost, budget.safety)
            hash(memo_key)
        except TypeError:  # an estimate that may change while it is the same object: worked out every time
            return self._least_chunk(budget)
        frames = self._least.get(memo_key)
        if frames is None:
            if len(self._least) >= LEAST_CHUNKS_KEPT:
                self._least.clear()
            frames = self._least[memo_key] = self._least_chunk(budget)
        return frames

    def _least_chunk(self, budget: StepBudget) -> int:
        g = self.g
        if not math.isfinite(budget.cost("decode", g.first_chunk)):
            return g.first_chunk  # a budget nothing fits: the configured size

        def grows(n: int) -> bool:
            return budget.safety * self.chunk_cost(budget.cost, round(RAMP_GROWTH * n)) <= n * g.frame_s

        frames = smallest(g.first_chunk, g.max_chunk, grows)
        return frames if grows(frames) else g.max_chunk

    def compute_per_frame(self, cost: CostEstimate) -> float:
        """Compute seconds per frame of audio at the largest window and chunk (the voice's steady cost)."""
        g = self.g
        decode = cost("decode", self.chunk_size(g.max_chunk)) / g.max_chunk
        flow = cost("flow", self.window_size(g.max_window)) / g.max_window
        return decode + flow

    def start_cost(self, cost: CostEstimate) -> StartCost | None:
        """A segment's start over the steady cost of its audio: chunks growing by ``RAMP_GROWTH`` from the first
        to the largest, each with a flow window of its own (an upper bound: the plan's windows grow faster); None
        before any cost is measured."""
        g = self.g
        steady = self.compute_per_frame(cost)
        if steady <= 0:
            return None
        frames, extra, audio = g.first_chunk, 0.0, 0
        while frames < g.max_chunk:
            extra += self.chunk_cost(cost, frames) - steady * frames
            audio += frames
            frames = max(frames + 1, round(RAMP_GROWTH * frames))
        return StartCost(max(0.0, extra), audio * g.frame_s)

    # -- the plan -----------------------------------------------------------------------------------

    def next(self, p: Progress, budget: StepBudget) -> FlowWindow | DecodeChunk:
        """The next window or chunk of a segment with frames left, sized to ``budget``.

        No chunk is smaller than the least one chunks can grow from (``least_chunk``): a chunk whose audio
        ends before the next one can be made leads to a gap whatever follows. Before its first audio a
        stream takes that least chunk, or under load ``FIRST_CHUNK_SHARE_OF_ROUND`` of a round. After it,
        the size is the largest that fits the call budget and this stream's own buffer; but never below the
        size at which the machine keeps up with its load (each frame may cost at most ``1 / (load ×
        safety)`` times what it costs at the largest size), unless the stream's own buffer cannot wait for it.
        A stream whose listener is already out of audio (as when the machine slows down under the streams it
        admitted) keeps that floor: small chunks cost more per second of audio, and under load they would keep
        every stream behind. A stream still starting (its listener holds less than a round of the machine,
        ``still_starting``) flows no further ahead than its next ``STARTING_FLOW_CHUNKS`` full-size chunks need.
        """
        g = self.g
        first = budget.due_s is None
        least = self.least_chunk(budget)
        if first:
            least = max(least, min(g.max_chunk, round(FIRST_CHUNK_SHARE_OF_ROUND * budget.load * g.max_chunk)))
        smallest = self.chunk(p, self.chunk_end(p, least))
        if p.flowed >= smallest.hi:
            if first:
                return smallest
            # Frames a chunk may cover with the latent made so far.
            if p.flowed >= p.frames:
                room = p.frames - p.decoded
            else:
                room = p.flowed - g.overlap - g.decoder_context - p.decoded
            largest = max(least, min(g.max_chunk, room))
            steady = (g.max_chunk, self.chunk_size(g.max_chunk))
            return _choose(
                lambda n: self.chunk(p, self.chunk_end(p, n)), least, largest, lambda chunk: 0.0, steady, budget
            )
        window = self.window(p, smallest.hi)
        if first:
            return window  # first audio: just what the first chunk needs
        then = budget.cost("decode", smallest.size)
        steady = (g.max_window, self.window_size(g.max_window))
        largest = max(smallest.hi - p.flowed, min(g.max_window, p.frames - p.flowed))
        chosen = _choose(
            lambda n: self.window(p, self.window_end(p, n)),
            smallest.hi - p.flowed,
            largest,
            lambda window: then,
            steady,
            budget,
        )
        if not budget.dry and still_starting(budget.due_s, budget.load, g.max_chunk_s):
            # Still building its buffer: the latent of its next full-size chunks, not seconds more ahead of time, so
            # that its start (and with it the next newcomer's admission) is not held up by work that can wait. A stream
            # already out of audio (the machine slowed under its load) keeps efficient windows, as ``_choose`` says.
            full_chunks = self.chunk(p, self.chunk_end(p, STARTING_FLOW_CHUNKS * g.max_chunk))
            return min(chosen, self.window(p, self.window_end(p, full_chunks.hi - p.flowed)), key=lambda w: w.end)
        return chosen


Action = TypeVar("Action", FlowWindow, DecodeChunk)


def _choose(
    build: Callable[[int], Action],
    low: int,
    high: int,
    then: Callable[[Action], float],
    steady: tuple[int, int],
    budget: StepBudget,
) -> Action:
    """The window or chunk of ``low``..``high`` frames that ``Planner.next`` describes.

    ``then``: seconds of the steps that must follow before audio; ``steady``: (frames, size) of the largest.
    """
    kind = build(low).kind
    cost = budget.cost

    def seconds(action: Action) -> float:
        return cost(kind, action.size)

    def own(n: int) -> bool:
        action = build(n)
        return budget.due_fits(seconds(action) + then(action))

    def call(n: int) -> bool:
        return own(n) and budget.call_fits(seconds(build(n)))

    chosen = _largest(low, high, call)
    if budget.load > 0:
        steady_frames, steady_size = steady
        limit = cost(kind, steady_size) / steady_frames / (budget.load * budget.safety)

        def efficient(n: int) -> bool:
            action = build(n)
            return seconds(action) / max(1, action.end - action.start) <= limit

        floor = smallest(low, high, efficient)
        # The floor gives way to this stream's own buffer, unless its listener is already out of audio.
        chosen = max(chosen, floor if budget.dry else min(floor, _largest(low, high, own)))
    return build(max(low, chosen))


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [low, high] with fits(n) (fits holds up to some n and not past it); 0 when none."""
    if high < low or not fits(low):
        return 0
    first_misfit = smallest(low, high, lambda n: not fits(n))
    return high if fits(first_misfit) else first_misfit - 1


def smallest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The smallest n in [low, high] with fits(n) (fits fails up to some n and holds past it); high when none."""
    if high <= low or fits(low):
        return low
    if not fits(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
