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

import torch
import torch.nn.functional as F

from .flow import CausalMaskedDiffWithXvec
from .hift import HiFTGenerator
from .sampling import new_generator

MEL_CACHE_FRAMES = 8
"""Mel frames of context each streaming HiFT call repeats from the previous chunk."""
MAX_HOP_FACTOR = 4
"""The hop grows (doubling) up to this many ``chunk_size``s: fewer, longer flow calls later on."""
HOP_GROWTH = 2


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

    @torch.inference_mode()
    def offline(
        self,
        tokens: torch.Tensor,
        prompt: FlowPrompt,
        speed: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """All tokens [1, N] in one call -> audio [1, samples]. ``speed`` > 1 shortens by resampling the mel."""
        mel = self.flow(tokens, prompt.tokens, prompt.feat, prompt.embedding, streaming=False, finalize=True)
        if speed != 1.0:
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        speech, _ = self.hift(mel, generator=generator or new_generator(device=mel.device))
        return speech

    def stream(self, prompt: FlowPrompt, generator: torch.Generator | None = None) -> Token2WavStream:
        """A new stream; ``generator`` drives HiFT's random source (its own, from OS entropy, if None)."""
        return Token2WavStream(self, prompt, generator or new_generator(device=prompt.tokens.device))


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
        if not self.ready():
            raise RuntimeError("step() without a ready chunk")
        hop = self._this_hop
        if len(self.tokens) - self.token_offset >= hop + self.engine.pre_lookahead:
            upto = self.token_offset + hop + self.engine.pre_lookahead
            speech = self._chunk(self.tokens[:upto], finalize=False)
            self.token_offset += hop
            self.hop = min(self.engine.chunk_size * MAX_HOP_FACTOR, self.hop * HOP_GROWTH)
            return speech
        self.done = True
        return self._chunk(self.tokens, finalize=True)

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

    def _chunk(self, tokens: list[int], finalize: bool) -> torch.Tensor:
        eng, p = self.engine, self.prompt
        token_tensor = torch.tensor([tokens], dtype=torch.int32, device=p.tokens.device)
        # the final call uses full attention, like an offline call
        mel = eng.flow(token_tensor, p.tokens, p.feat, p.embedding, streaming=not finalize, finalize=finalize)
        mel = mel[:, :, self.token_offset * eng.token_mel_ratio :]
        self.last_mel = mel
        if self._mel_cache is not None:
            mel = torch.cat([self._mel_cache, mel], dim=2)
        speech, source = eng.hift(mel, cache_source=self._source_cache, generator=self.generator)
        if self._speech_tail is not None:
            speech = _cross_fade(speech, self._speech_tail, eng.window)
        if finalize:
            return speech
        self._mel_cache = mel[:, :, -MEL_CACHE_FRAMES:]
        self._source_cache = source[:, :, -eng.source_cache_len :]
        self._speech_tail = speech[:, -eng.source_cache_len :]
        return speech[:, : -eng.source_cache_len]
