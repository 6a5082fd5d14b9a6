"""The CosyVoice2 text-to-speech-token LM: a Qwen2 backbone with its own speech-token embedding
and output head.

Sequence fed to the backbone: [sos] + text embeddings (prompt text, then the text to speak) +
[task_id] + prompt speech-token embeddings; then one speech token per step. The head scores
``speech_token_size + 3`` ids: the speech tokens, then eos and two more ids that also end decoding.

All per-request state (KV cache, position, tokens so far, RNG) lives in an :class:`LMStream`; the
module holds only weights, so any number of streams can share it. :meth:`Qwen2LM.forward_step`
takes a list of streams so that a batched implementation can replace its loop without changing
callers.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, Qwen2Config, Qwen2Model

from .config import LLMConfig
from .sampling import new_generator, ras_sample

# transformers 5.x renamed the cache argument; accept either spelling.
_CACHE_KWARG = "cache" if "cache" in inspect.signature(Qwen2Model.forward).parameters else "past_key_values"


@dataclass
class LMStream:
    """One request's decoding state."""

    pending: torch.Tensor
    """Embeddings [1, L, D] not yet run through the backbone: the prompt, then the last token."""
    cache: DynamicCache
    min_len: int
    max_len: int
    generator: torch.Generator
    position: int = 0
    """Positions already in the KV cache."""
    tokens: list[int] = field(default_factory=list)
    finished: bool = False


class Qwen2LM(nn.Module):
    def __init__(self, cfg: LLMConfig, backbone_config: Qwen2Config) -> None:
        super().__init__()
        self.cfg = cfg
        vocab = cfg.speech_token_size + 3
        self.eos = cfg.speech_token_size
        self.stop_tokens = frozenset(range(cfg.speech_token_size, vocab))
        self.llm_embedding = nn.Embedding(2, cfg.llm_input_size)  # row 0: sos, row 1: task_id
        self.speech_embedding = nn.Embedding(vocab, cfg.llm_input_size)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, vocab)
        self.backbone = Qwen2Model(backbone_config)

    def prompt_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_tokens: torch.Tensor
    ) -> torch.Tensor:
        """[1, L, D] backbone input for text ids [1, N] after prompt text ids [1, P] and prompt speech tokens [1, S]."""
        text_emb = self.backbone.embed_tokens(torch.cat([prompt_text, text], dim=1).long())
        parts = [self.llm_embedding.weight[0:1][None], text_emb, self.llm_embedding.weight[1:2][None]]
        if prompt_speech_tokens.shape[1] > 0:
            parts.append(self.speech_embedding(prompt_speech_tokens.long()))
        return torch.cat(parts, dim=1)

    @torch.inference_mode()
    def start(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor,
        prompt_speech_tokens: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        min_token_text_ratio: float = 2.0,
        max_token_text_ratio: float = 20.0,
    ) -> LMStream:
        """A new stream. Its length bounds scale with the text to speak (prompt text excluded).
        Without a ``generator`` the stream gets its own, seeded from OS entropy."""
        n_text = text.shape[1]
        max_len = int(n_text * max_token_text_ratio)
        return LMStream(
            pending=self.prompt_embeddings(text, prompt_text, prompt_speech_tokens),
            cache=DynamicCache(config=self.backbone.config),
            min_len=int(n_text * min_token_text_ratio),
            max_len=max_len,
            generator=generator or new_generator(device=self.llm_decoder.weight.device),
            finished=max_len <= 0,
        )

    @torch.inference_mode()
    def forward_step(self, streams: Sequence[LMStream]) -> list[torch.Tensor]:
        """Run each stream's pending input through the backbone; return per stream the
        log-probabilities [V] of the next token (no masking). Advances each stream's KV cache."""
        out: list[torch.Tensor] = []
        for s in streams:
            length = s.pending.shape[1]
            positions = torch.arange(s.position, s.position + length, device=s.pending.device)[None]
            hidden = self.backbone(
                inputs_embeds=s.pending, position_ids=positions, use_cache=True, **{_CACHE_KWARG: s.cache}
            ).last_hidden_state
            s.position += length
            out.append(F.log_softmax(self.llm_decoder(hidden[0, -1]), dim=-1))
        return out

    @torch.inference_mode()
    def choose(self, stream: LMStream, logp: torch.Tensor, greedy: bool = False) -> int | None:
        """Pick the next token from ``logp``; append it and queue its embedding, or return None
        (and mark the stream finished) on a stop token or at ``max_len``."""
        if stream.finished:
            raise RuntimeError("stream already finished")
        scores = logp
        if len(stream.tokens) < stream.min_len:
            scores = logp.clone()
            # Too short to end: mask eos. As in the reference, the two other stop ids stay open; the
            # trained model does not produce them.
            scores[self.eos] = float("-inf")
        if greedy:
            token = int(scores.argmax())
        else:
            token = ras_sample(scores, stream.tokens, self.cfg.sampling, stream.generator)
        if token in self.stop_tokens:
            stream.finished = True
            return None
        stream.tokens.append(token)
        stream.pending = self.speech_embedding.weight[token][None, None]
        if len(stream.tokens) >= stream.max_len:
            stream.finished = True
        return token

    def generate(self, stream: LMStream, greedy: bool = False) -> Iterator[int]:
        """Decode ``stream`` to the end, one token per step."""
        while not stream.finished:
            token = self.choose(stream, self.forward_step([stream])[0], greedy)
            if token is not None:
                yield token
