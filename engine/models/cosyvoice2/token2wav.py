"""Speech tokens -> audio, offline and streaming.

Streaming scheme (CosyVoice2's): the flow is re-run over *all* tokens so far (prompt included) each
time a hop of new tokens plus ``pre_lookahead_len`` look-ahead tokens is available, with chunked
attention so earlier frames do not change; only the new frames are kept. The first hop is
``chunk_size`` tokens plus the pad that makes prompt + first hop a multiple of ``chunk_size``
(chunk boundaries then line up with the flow's attention chunks); each later hop doubles, up to
4 x ``chunk_size``. HiFT runs on the new mel frames prefixed with the last ``MEL_CACHE_FRAMES``
frames of the previous chunk, its excitation head replaced by the previous chunk's source tail, and
the overlap cross-faded with a Hamming window; the last ``MEL_CACHE_FRAMES`` frames of audio of
each chunk are held back for that overlap. The final call uses full (non-chunked) attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .flow import CausalMaskedDiffWithXvec, FlowItem
from .hift import HiFTGenerator
from .sampling import new_generator

MEL_CACHE_FRAMES = 8
"""Mel frames of context each streaming HiFT call repeats from the previous chunk."""
MAX_HOP_FACTOR = 4
"""The hop grows (doubling) up to this many ``chunk_size``s: fewer, longer flow calls later on."""
HOP_GROWTH = 2


class ChunkPlan(NamedTuple):
    """One chunk's flow input: every token up to its end (look-ahead included), and whether it is the last."""

    tokens: list[int]
    finalize: bool


@dataclass(frozen=True)
class FlowPrompt:
    """The voice prompt for the flow: its speech tokens [1, P], mel [1, T, C] and x-vector [1, E]."""

    tokens: torch.Tensor
    feat: torch.Tensor
    embedding: torch.Tensor


def _cross_fade(head: torch.Tensor, previous_tail: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Blend the first ``len(window) // 2`` samples of ``head`` with ``previous_tail``."""
    n = window.shape[0] // 2
    window = window.to(head.device)  # a no-op on the CPU; the model may run on a GPU
    out = head.clone()
    # in float64 like the reference, whose window is a numpy array
    blended = head[..., :n].double() * window[:n] + previous_tail[..., -n:].double() * window[n:]
    out[..., :n] = blended.to(head.dtype)
    return out


class Token2Wav:
    """Weights-only token-to-audio engine; per-stream state lives in :class:`Token2WavStream`."""

    def __init__(
        self,
        flow: CausalMaskedDiffWithXvec,
        hift: HiFTGenerator,
        chunk_size: int,
    ) -> None:
        self.flow = flow
        self.hift = hift
        self.chunk_size = chunk_size
        self.pre_lookahead = flow.cfg.pre_lookahead_len
        self.token_mel_ratio = flow.cfg.token_mel_ratio
        self.source_cache_len = MEL_CACHE_FRAMES * hift.cfg.samples_per_frame
        self.window = torch.hamming_window(2 * self.source_cache_len, periodic=False, dtype=torch.float64)

    def stream(self, prompt: FlowPrompt, generator: torch.Generator | None = None) -> Token2WavStream:
        """A new stream; ``generator`` drives HiFT's random source (its own, from OS entropy, if None)."""
        return Token2WavStream(self, prompt, generator or new_generator(device=prompt.tokens.device))

    @torch.inference_mode()
    def step_many(
        self, streams: Sequence[Token2WavStream], plans: Sequence[ChunkPlan] | None = None
    ) -> list[torch.Tensor]:
        """The next chunk of each stream ([1, samples] each), computed together: the flow calls of all
        of them in one padded batch (per-row lengths, chunk masks and prompts), HiFT on the rows whose
        mel windows have the same length in one batch each (its convolutions are not causal, so rows
        of different lengths are not padded together), each row with its own generator and caches.
        Each chunk equals what :meth:`Token2WavStream.step` makes for that stream alone. ``plans``: each stream's
        chunk as planned when its step was made (``Token2WavStream.plan``), so tokens the LM adds meanwhile on
        another thread change nothing; planned now when None."""
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("a stream appears twice in one call")
        plans = list(plans) if plans is not None else [s.plan() for s in streams]
        items = [
            FlowItem(
                torch.tensor([tokens], dtype=torch.int32, device=s.prompt.tokens.device),
                s.prompt.tokens,
                s.prompt.feat,
                s.prompt.embedding,
                streaming=not finalize,
                finalize=finalize,
            )
            for s, (tokens, finalize) in zip(streams, plans, strict=True)
        ]
        mels = self.flow.forward_batch(items)
        windows = []
        for s, mel in zip(streams, mels, strict=True):
            mel = mel[:, :, s.token_offset * self.token_mel_ratio :]
            s.last_mel = mel
            windows.append(mel if s._mel_cache is None else torch.cat([s._mel_cache, mel], dim=2))
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, (s, window) in enumerate(zip(streams, windows, strict=True)):
            groups.setdefault((window.shape[2], s._source_cache is None), []).append(i)
        vocoded: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(streams)
        for rows in groups.values():
            if len(rows) == 1:
                (i,) = rows
                vocoded[i] = self.hift(
                    windows[i], cache_source=streams[i]._source_cache, generator=streams[i].generator
                )
                continue
            # A group's rows all have a source cache or none has (it is part of the key).
            caches = [cache for i in rows if (cache := streams[i]._source_cache) is not None]
            speech, source = self.hift(
                torch.cat([windows[i] for i in rows]),
                cache_source=torch.cat(caches) if caches else None,
                generator=[streams[i].generator for i in rows],
            )
            for j, i in enumerate(rows):
                vocoded[i] = (speech[j : j + 1], source[j : j + 1])
        chunks = []
        for s, window, (_, finalize), out in zip(streams, windows, plans, vocoded, strict=True):
            assert out is not None
            chunks.append(s._finish_chunk(window, out[0], out[1], finalize))
        return chunks


class Token2WavStream:
    """One stream's incremental token-to-audio state.

    Event-driven: :meth:`push` tokens as the LM produces them, :meth:`finish` when it stops; both
    return the audio chunks that became final. For a scheduler that wants to decide when to spend
    compute, :meth:`ready` / :meth:`step` expose the same work one chunk at a time.
    """

    def __init__(self, engine: Token2Wav, prompt: FlowPrompt, generator: torch.Generator) -> None:
        self.engine = engine
        self.prompt = prompt
        self.generator = generator
        self.tokens: list[int] = []
        self.token_offset = 0
        self.hop = engine.chunk_size
        n_prompt = prompt.tokens.shape[1]
        self.prompt_pad = math.ceil(n_prompt / engine.chunk_size) * engine.chunk_size - n_prompt
        self.ended = False
        self.done = False
        self._mel_cache: torch.Tensor | None = None
        self._source_cache: torch.Tensor | None = None
        self._speech_tail: torch.Tensor | None = None
        self.last_mel: torch.Tensor | None = None
        """The new flow frames of the latest chunk (before the HiFT mel cache), for inspection."""

    @property
    def _this_hop(self) -> int:
        return self.hop + self.prompt_pad if self.token_offset == 0 else self.hop

    def add_tokens(self, tokens: Sequence[int]) -> None:
        if self.ended:
            raise RuntimeError("tokens added after end()")
        self.tokens.extend(int(t) for t in tokens)

    def end(self) -> None:
        """No more tokens will come."""
        self.ended = True

    def ready(self) -> bool:
        """True when :meth:`step` has a chunk to compute."""
        if self.done:
            return False
        return self.ended or len(self.tokens) - self.token_offset >= self._this_hop + self.engine.pre_lookahead

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Compute the next chunk of audio [1, samples] (the last one once :meth:`end` was called
        and too few tokens remain for a full hop)."""
        return self.engine.step_many([self])[0]

    def plan(self) -> ChunkPlan:
        """The tokens the next flow call takes (look-ahead included) and whether it is the final one."""
        if not self.ready():
            raise RuntimeError("step() without a ready chunk")
        if len(self.tokens) - self.token_offset >= self._this_hop + self.engine.pre_lookahead:
            return ChunkPlan(self.tokens[: self.token_offset + self._this_hop + self.engine.pre_lookahead], False)
        return ChunkPlan(list(self.tokens), True)

    def push(self, tokens: Sequence[int]) -> list[torch.Tensor]:
        """Add tokens; return every chunk that can now be computed."""
        self.add_tokens(tokens)
        chunks = []
        while self.ready():
            chunks.append(self.step())
        return chunks

    def finish(self) -> list[torch.Tensor]:
        """End the token stream; return the remaining chunks (the last is the flush)."""
        self.end()
        chunks = []
        while self.ready():
            chunks.append(self.step())
        return chunks

    def _finish_chunk(
        self, mel: torch.Tensor, speech: torch.Tensor, source: torch.Tensor, finalize: bool
    ) -> torch.Tensor:
        """Cross-fade the vocoded window ``mel`` -> ``speech``, keep the caches, advance the hop schedule."""
        eng = self.engine
        if self._speech_tail is not None:
            speech = _cross_fade(speech, self._speech_tail, eng.window)
        if finalize:
            self.done = True
            return speech
        self.token_offset += self._this_hop
        self.hop = min(eng.chunk_size * MAX_HOP_FACTOR, self.hop * HOP_GROWTH)
        self._mel_cache = mel[:, :, -MEL_CACHE_FRAMES:]
        self._source_cache = source[:, :, -eng.source_cache_len :]
        self._speech_tail = speech[:, -eng.source_cache_len :]
        return speech[:, : -eng.source_cache_len]
