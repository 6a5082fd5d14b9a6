"""A session's concurrent lane (``VoiceSession.concurrent_step``) on the real scheduler in simulated time: a
CosyVoice2-shaped voice whose LM keeps stepping every stream while token-to-wave chunks are vocoded beside it, at
GPU-like costs (a batch costs little more than one row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rtvoice.engine.models.base import Step, StepPayload, SynthesisOptions, Voice, VoiceInfo, VoiceSession
from rtvoice.engine.scheduler import Limits
from tests.fake_voice import Simulation

RATE = 24000
TOKEN_S = 0.04
"""Audio per speech token (25 tokens a second, as CosyVoice2's)."""
HOP = 25
TOKENS = 150


@dataclass
class LMJob(StepPayload):
    kind = "lm"
    session: TokenSession


@dataclass
class ChunkJob(StepPayload):
    kind = "token2wav"
    session: TokenSession
    tokens: int
    """Tokens the chunk covers, fixed when its step was made."""


class TokenVoice(Voice):
    """An LM that makes ``TOKENS`` tokens a segment and a vocoder that turns each ``HOP`` of them into audio."""

    def __init__(self, concurrent: bool) -> None:
        self.info = VoiceInfo(id="tokens", name="tokens", language="en", sample_rate=RATE, model="fake")
        self.concurrent = concurrent
        self.in_flight: set[tuple[int, str]] = set()

    def open_session(self, options: SynthesisOptions) -> TokenSession:
        return TokenSession(self)

    def max_batch(self, kind: str) -> int:
        return 64

    def call_s(self, payloads: Sequence[StepPayload]) -> float:
        # GPU-like: a batched call costs about what one row does (the host launches it).
        if payloads[0].kind == "lm":
            return 0.008 + 0.0002 * len(payloads)
        return 0.060 + 0.004 * len(payloads)

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        out: list[Any] = []
        for payload in payloads:
            assert isinstance(payload, (LMJob, ChunkJob))
            if isinstance(payload, ChunkJob):
                out.append(np.full(round(payload.tokens * TOKEN_S * RATE), 0.1, dtype=np.float32))
            else:
                out.append(None)
        return out


class TokenSession(VoiceSession):
    def __init__(self, voice: TokenVoice) -> None:
        self.voice = voice
        self.segments: list[str] = []
        self.made = 0
        """Tokens the LM has made in the current segment."""
        self.vocoded = 0
        self.lm_steps = 0

    @property
    def idle(self) -> bool:
        return not self.segments

    def add_segment(self, text: str, rate: float = 1.0) -> None:
        self.segments.append(text)

    def _chunk(self) -> Step | None:
        ready = self.made - self.vocoded
        if ready >= HOP or (self.made == TOKENS and ready > 0):
            job = ChunkJob(self, min(ready, HOP))
            return Step((job.kind,), job, self, size=1)
        return None

    def next_step(self) -> Step | None:
        if not self.segments:
            return None
        chunk = self._chunk()
        if self.made < TOKENS and (self.voice.concurrent or chunk is None):
            return Step(("lm",), LMJob(self), self, size=1)
        return chunk

    def concurrent_step(self) -> Step | None:
        if not self.voice.concurrent or not self.segments or self.made >= TOKENS:
            return None
        return self._chunk()

    def complete(self, step: Step, result: Any) -> np.ndarray | None:
        if isinstance(step.payload, LMJob):
            self.made += 1
            self.lm_steps += 1
            return None
        assert isinstance(step.payload, ChunkJob)
        self.vocoded += step.payload.tokens
        if self.vocoded == TOKENS:
            self.segments.pop(0)
            self.made = self.vocoded = 0
            self.segments_done += 1
        return result


def simulate(concurrent: bool, streams: int) -> tuple[Simulation, list[int]]:
    voice = TokenVoice(concurrent)
    sim = Simulation(voice, slots=2, limits=Limits(max_batch_size=64, max_active_streams=64))  # type: ignore[arg-type]
    lm_batches: list[int] = []
    pick = sim.scheduler.pick_batch

    def picked() -> Any:
        batch = pick()
        if batch is not None:
            # Never two steps of one kind of one stream at once, nor a session in two calls of one kind.
            ids = [id(step.session) for _, step in batch.items]
            assert len(set(ids)) == len(ids)
            for session_id in ids:
                assert (session_id, batch.kind) not in voice.in_flight
                voice.in_flight.add((session_id, batch.kind))
            if batch.kind == "lm":
                lm_batches.append(len(batch.items))
        return batch

    complete = sim.scheduler.complete

    def completed(batch: Any, output: Any) -> None:
        for _, step in batch.items:
            voice.in_flight.discard((id(step.session), batch.kind))
        complete(batch, output)

    sim.scheduler.pick_batch = picked  # type: ignore[method-assign]
    sim.scheduler.complete = completed  # type: ignore[method-assign]
    sim.calibrate()
    for _ in range(streams):
        sim.open("One sentence to say.")
    sim.run()
    return sim, lm_batches


@pytest.mark.parametrize("streams", [8, 16])
def test_the_lm_keeps_stepping_every_stream_while_chunks_are_vocoded(streams: int) -> None:
    sim, lm_batches = simulate(True, streams)
    beside, one_lane = lm_batches, simulate(False, streams)[1]
    mean = sum(beside) / len(beside)
    assert all(stream.state.value == "done" for stream in sim.streams)
    assert all(stream.emitted_s == pytest.approx(TOKENS * TOKEN_S, abs=0.05) for stream in sim.streams)
    assert mean >= 0.9 * streams, (mean, sum(one_lane) / len(one_lane))
    assert sim.scheduler.mean_batch_size("lm") >= 0.9 * streams
    # One lane: a stream's LM waits while its chunk is vocoded, and the batch falls apart.
    assert sum(one_lane) / len(one_lane) < 0.8 * mean
