"""The CosyVoice2 text-to-speech-token LM: a Qwen2 backbone with its own speech-token embedding
and output head.

Sequence fed to the backbone: [sos] + text embeddings (prompt text, then the text to speak) +
[task_id] + prompt speech-token embeddings; then one speech token per step. The head scores
``speech_token_size + 3`` ids: the speech tokens, then eos and two more ids that also end decoding.

All per-request state (KV cache, position, tokens so far, RNG) lives in an :class:`LMStream`; the
module holds only weights, so any number of streams can share it.

Continuous batching: :meth:`Qwen2LM.forward_step` runs the pending inputs of any set of streams in ONE
backbone pass, whatever their cache lengths and whether they are prefilling (a prompt of many
positions) or decoding (one token). Each stream keeps its own KV buffer for all layers
(``[layers, 2, kv_heads, capacity, head_dim]``, grown in blocks, so streams of different ages have
different capacities); a call copies the streams' valid caches into one right-padded batch, writes
the new keys and values at each stream's own positions, attends with a per-stream mask (key ``j`` is
visible to the query at position ``p`` iff ``j <= p``; padding and other streams' rows never are)
and per-stream RoPE positions, and copies the new positions back to each stream's buffer. Streams
join (prefill) and leave (finish, are cancelled, or skip a step for a token-to-wave chunk) between
calls freely, because nothing but the weights is shared. The decoder layers are the backbone's own
modules (norms, projections, MLP, rotary embedding); only the attention and the cache are ours.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2Config, Qwen2Model

from .config import LLMConfig
from .sampling import new_generator, ras_sample

if TYPE_CHECKING:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

KV_BLOCK = 128
"""KV buffers grow in whole blocks of this many positions (amortised copies, few reallocations)."""


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class LMStream:
    """One request's decoding state."""

    pending: torch.Tensor
    """Embeddings [1, L, D] not yet run through the backbone: the prompt, then the last token."""
    min_len: int
    max_len: int
    generator: torch.Generator
    position: int = 0
    """Positions already in the KV cache."""
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    kv: torch.Tensor | None = field(default=None, repr=False)
    """This stream's keys and values, [layers, 2, kv_heads, capacity, head_dim]; valid up to ``position``."""


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
        c = backbone_config
        self.n_heads = c.num_attention_heads
        # Qwen2Config itself puts num_attention_heads in for a missing num_key_value_heads (no grouped queries).
        self.n_kv_heads: int = c.num_attention_heads if c.num_key_value_heads is None else c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        if getattr(c, "use_sliding_window", False) and getattr(c, "sliding_window", None):
            # Released CosyVoice2 (Qwen2.5-0.5B) attends to the whole sequence; a windowed backbone would
            # need the window in the mask below.
            raise ValueError("Qwen2 backbones with sliding-window attention are not supported")

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
            min_len=int(n_text * min_token_text_ratio),
            max_len=max_len,
            generator=generator or new_generator(device=self.llm_decoder.weight.device),
            finished=max_len <= 0,
        )

    @torch.inference_mode()
    def forward_step(self, streams: Sequence[LMStream]) -> list[torch.Tensor]:
        """Run every stream's pending input through the backbone in one batched pass; return per stream
        the log-probabilities [V] of its next token (no masking). Advances each stream's KV cache."""
        if not streams:
            return []
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("a stream appears twice in one step")
        hidden = self._forward([s.pending[0] for s in streams], list(streams))
        return list(F.log_softmax(self.llm_decoder(hidden), dim=-1).unbind(0))

    def _ensure_capacity(self, stream: LMStream, needed: int, like: torch.Tensor) -> torch.Tensor:
        """``stream.kv`` with room for ``needed`` positions (zero-filled: masked keys must stay finite)."""
        kv = stream.kv
        if kv is not None and kv.shape[3] >= needed:
            return kv
        capacity = -(-needed // KV_BLOCK) * KV_BLOCK
        layers = len(self.backbone.layers)
        grown = torch.zeros(layers, 2, self.n_kv_heads, capacity, self.head_dim, dtype=like.dtype, device=like.device)
        if kv is not None and stream.position > 0:
            grown[:, :, :, : stream.position] = kv[:, :, :, : stream.position]
        stream.kv = grown
        return grown

    def _allowed(self, past: torch.Tensor, new: int, total: int) -> torch.Tensor:
        """[B, 1, new, total] bool: key ``j`` is visible to new position ``i`` of row ``b`` iff
        ``j <= past[b] + i`` (its own cache and itself, causally; never padding)."""
        query_pos = past[:, None] + torch.arange(new, device=past.device)[None]  # [B, N]
        keys = torch.arange(total, device=past.device)
        return (keys[None, None, :] <= query_pos[:, :, None])[:, None]

    def _forward(self, inputs: list[torch.Tensor], streams: list[LMStream]) -> torch.Tensor:
        """inputs[b] [L_b, D] after stream b's cache -> final hidden state [B, D] of each stream's last input."""
        device = inputs[0].device
        lengths = [x.shape[0] for x in inputs]
        past_list = [s.position for s in streams]
        n_new, total = max(lengths), max(p + n for p, n in zip(past_list, lengths, strict=True))
        batch = len(streams)
        x = inputs[0][None] if batch == 1 else nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # [B, N, D]
        past = torch.tensor(past_list, device=device)
        positions = past[:, None] + torch.arange(n_new, device=device)[None]  # [B, N]

        buffers = [self._ensure_capacity(s, p + n, x) for s, p, n in zip(streams, past_list, lengths, strict=True)]
        if batch == 1:
            kv = buffers[0][None, :, :, :, :total]  # a view: new positions land in the stream's buffer
        else:
            # Each stream's own buffer holds only its own positions and has its own capacity (one stream may
            # have grown past a block another has not reached), so the batch gets a fresh right-padded copy
            # of every stream's valid cache. Zero padding keeps the masked keys finite.
            first = buffers[0]
            kv = first.new_zeros(batch, *first.shape[:3], total, first.shape[4])  # [B, layers, 2, Hkv, T, hd]
            for b, (buffer, p) in enumerate(zip(buffers, past_list, strict=True)):
                kv[b, :, :, :, :p] = buffer[:, :, :, :p]
        # Where each new position goes: rows and positions of the valid (unpadded) inputs (built on the
        # host, one transfer each: no per-stream kernels on a GPU).
        rows = torch.tensor([b for b, n in enumerate(lengths) for _ in range(n)], device=device)
        cols = torch.tensor([i for n in lengths for i in range(n)], device=device)  # index into the new inputs
        slots = torch.tensor([p + i for p, n in zip(past_list, lengths, strict=True) for i in range(n)], device=device)

        mask = self._allowed(past, n_new, total)
        cos, sin = self.backbone.rotary_emb(x, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, N, hd]
        layers = cast("Sequence[Qwen2DecoderLayer]", self.backbone.layers)  # the ModuleList Qwen2Model builds
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, n_new, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, n_new, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(batch, n_new, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = kv[:, index, 0], kv[:, index, 1]  # [B, Hkv, T, hd]
            keys[rows, :, slots] = k.transpose(1, 2)[rows, cols]
            values[rows, :, slots] = v.transpose(1, 2)[rows, cols]
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=self.n_heads != self.n_kv_heads
            )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, n_new, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = torch.tensor(lengths, device=device) - 1
        hidden = self.backbone.norm(x[torch.arange(batch, device=device), last])  # [B, D]

        for b, (stream, p, n) in enumerate(zip(streams, past_list, lengths, strict=True)):
            if batch > 1:
                buffers[b][:, :, :, p : p + n] = kv[b, :, :, :, p : p + n]
            stream.position = p + n
        return hidden

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
