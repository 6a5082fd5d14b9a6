"""One stream's Piper synthesis: its noise generator, its segments in order, and the steps that make their audio.

A segment is encoded whole, then its latent made in flow windows and its audio in decoder chunks, as the chunk plan
(``plan.py``) sizes them; neighbouring chunks overlap by a few samples, joined with a Hamming cross-fade so the joins
are not heard.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from piper.config import PiperConfig

from rtvoice.engine.audio.pcm import hamming_crossfade
from rtvoice.engine.models.base import (
    MAX_SPEED,
    MIN_SPEED,
    SegmentTimings,
    Step,
    StepBudget,
    SynthesisOptions,
    VoiceInfo,
    VoiceSession,
)
from rtvoice.engine.models.piper.plan import DecodeChunk, Geometry, Planner, Progress
from rtvoice.engine.models.piper.stages import PiperGraphs
from rtvoice.engine.models.piper.steps import DecodeJob, EncodedSegment, EncodeJob, FlowJob, PiperStep


class SessionVoice(Protocol):
    """What a session reads of its voice (``PiperVoice``): a protocol, so that this module need not import the voice's
    module, which imports this one to open sessions."""

    config: PiperConfig
    info: VoiceInfo
    hop: int
    graphs: PiperGraphs
    geometry: Geometry
    planner: Planner
    frames_per_char: float | None


@dataclass
class _Segment:
    """A segment of the stream: its text, then its flow inputs, its latent, and how far flow and decoder have got."""

    text: str
    speed: float
    frames: int = -1
    frame_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    latent: np.ndarray | None = None
    flowed: int = 0
    decoded: int = 0
    tail: np.ndarray | None = None

    @property
    def progress(self) -> Progress:
        return Progress(self.frames, self.flowed, self.decoded)


class PiperSession(VoiceSession):
    """A stream's state: its own noise generator (its seed makes its speech reproducible), its segments, and the
    cross-fade tail of its last chunk."""

    def __init__(self, voice: SessionVoice, options: SynthesisOptions) -> None:
        self.voice = voice
        self.rng = np.random.default_rng(options.seed)
        self.speed = options.speed
        self.pending: deque[_Segment] = deque()
        self.current: _Segment | None = None
        self.owes_audio = False
        """True from a segment added while nothing was being synthesised until its first audio."""
        self.timings: list[SegmentTimings] = []
        """Token timings of encoded segments, until the stream takes them."""
        self.times_words = True
        """Whether encoding works out token timings (the stream sends words)."""

    @property
    def idle(self) -> bool:
        return self.current is None and not self.pending

    def take_timings(self) -> list[SegmentTimings]:
        timings, self.timings = self.timings, []
        return timings

    def skip_timings(self) -> None:
        self.times_words = False

    def add_segment(self, text: str, rate: float = 1.0) -> None:
        if self.idle:
            self.owes_audio = True
        speed = min(MAX_SPEED, max(MIN_SPEED, self.speed * rate))
        self.pending.append(_Segment(text=text, speed=speed))

    def next_step(self) -> PiperStep | None:
        """The plan without a scheduler's budget: a small first chunk, then windows and chunks at their caps."""
        unbounded = StepBudget(
            call_s=math.inf, due_s=None if self.owes_audio else math.inf, cost=lambda kind, size: 0.0
        )
        return self.plan_step(unbounded)

    def plan_step(self, budget: StepBudget) -> PiperStep | None:
        # Pure: it describes the next step without changing the session, so the
        # scheduler may ask every stream and schedule only some of them.
        v = self.voice
        if self.current is None:
            if not self.pending:
                return None
            job = EncodeJob(
                text=self.pending[0].text,
                rng=self.rng,
                length_scale=v.config.length_scale,
                noise_scale=v.config.noise_scale,
                noise_w=v.config.noise_w_scale,
                timings=self.times_words,
                speed=self.pending[0].speed,
            )
            # Batch keys carry a size bucket: padding a short step to a long one's length would slow the short one.
            size_bucket = len(job.text) // 64
            return Step(
                (job.kind, v.info.id, job.length_scale, size_bucket),
                job,
                self,
                size=len(job.text),
                until_audio=(
                    (FlowJob.kind, v.planner.first_window_size()),
                    (DecodeJob.kind, v.planner.first_chunk_size()),
                ),
            )
        segment = self.current
        action = v.planner.next(segment.progress, budget)
        if isinstance(action, DecodeChunk):
            assert segment.latent is not None  # made when the segment was encoded
            latent = segment.latent[:, action.lo : action.hi]
            return Step(
                (DecodeJob.kind, v.info.id, action.size),
                DecodeJob(latent, action.lo, action.end),
                self,
                size=action.size,
            )
        inputs = {
            name: (value[:, action.lo : action.hi] if value.ndim == 2 else value)
            for name, value in segment.frame_inputs.items()
        }
        flow = FlowJob(inputs=inputs, keep_from=action.start - action.lo, keep_frames=action.end - action.start)
        then = v.planner.chunk(segment.progress, v.planner.chunk_end(segment.progress, v.geometry.first_chunk))
        return Step(
            (flow.kind, v.info.id, action.size // 32),
            flow,
            self,
            size=action.size,
            until_audio=((DecodeJob.kind, then.size),),
        )

    def remaining_audio_s(self) -> float | None:
        v = self.voice
        frame_s = v.hop / v.info.sample_rate
        frames = 0.0
        if self.current is not None:
            frames += self.current.frames - self.current.decoded
        if self.pending:
            if not v.frames_per_char:
                return None  # not warmed up: no measure of how long its text speaks
            frames += sum(len(segment.text) * v.frames_per_char / segment.speed for segment in self.pending)
        return frames * frame_s

    def complete(self, step: PiperStep, result: Any) -> np.ndarray | None:
        payload = step.payload
        if isinstance(payload, EncodeJob):
            queued = self.pending.popleft()
            encoded: EncodedSegment = result
            if encoded.tokens is not None:
                self.timings.append(SegmentTimings(self.segments_done, encoded.tokens))
            if encoded.frames == 0:
                self.segments_done += 1
                return None
            self.current = queued
            queued.frames = encoded.frames
            queued.frame_inputs = {k: v for k, v in encoded.frame_inputs.items() if k in self.voice.graphs.flow.inputs}
            channels = queued.frame_inputs[self.voice.graphs.prior_mean].shape[0]
            queued.latent = np.empty((channels, encoded.frames), dtype=np.float32)
            return None
        segment = self.current
        assert segment is not None
        if isinstance(payload, FlowJob):
            assert segment.latent is not None  # made when the segment was encoded
            segment.latent[:, segment.flowed : segment.flowed + payload.keep_frames] = result
            segment.flowed += payload.keep_frames
            return None
        hop = self.voice.hop
        start, end = payload.start, payload.end
        audio = result[(segment.decoded - start) * hop :]
        body = audio[: (end - segment.decoded) * hop].copy()
        if segment.tail is not None and len(segment.tail):
            overlap = min(len(segment.tail), len(body))
            body[:overlap] = hamming_crossfade(segment.tail[:overlap], body[:overlap])
        tail_from = (end - segment.decoded) * hop
        segment.tail = audio[tail_from : tail_from + self.voice.geometry.overlap * hop]
        segment.decoded = end
        self.owes_audio = False
        if end >= segment.frames:
            self.current = None
            self.segments_done += 1
        return body
