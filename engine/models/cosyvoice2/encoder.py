"""The flow's token encoder: a causal-chunk Conformer (attention + FFN only) with a look-ahead conv,
2x nearest upsampling to the mel rate, and a second Conformer stack.

Relative-position self-attention follows the ESPnet "rel_pos_espnet" variant (Transformer-XL
style biases u and v). Submodule names mirror the checkpoint's ``encoder.*`` keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "swish": nn.SiLU,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
}


def chunk_mask(size: int, chunk: int, device: torch.device) -> torch.Tensor:
    """[size, size] bool: position i sees every position up to the end of its own chunk."""
    pos = torch.arange(size, device=device)
    limit = (pos // chunk + 1) * chunk
    return pos[None, :] < limit[:, None]


def padded_chunk_mask(size: int, chunks: list[int], lengths: list[int], device: torch.device) -> torch.Tensor:
    """[B, 1, size, size] bool for a right-padded batch: row b's position i sees key j iff j < lengths[b]
    and, when chunks[b] > 0, j is at most the end of i's chunk (``chunk_mask``); chunks[b] == 0 means
    full attention. Padded query rows still see key 0, so no softmax row is empty."""
    pos = torch.arange(size, device=device)
    chunk = torch.tensor(chunks, device=device)[:, None]  # [B, 1]
    length = torch.tensor(lengths, device=device)[:, None]
    limit = torch.where(chunk > 0, (pos[None] // chunk.clamp(min=1) + 1) * chunk, size)  # [B, size]
    limit = torch.minimum(limit, length).clamp(min=1)
    return (pos[None, None, :] < limit[:, :, None])[:, None]


def relative_positions(size: int, d_model: int, device: torch.device) -> torch.Tensor:
    """Sinusoidal encodings of relative distances size-1 ... -(size-1): [1, 2*size-1, d_model]."""
    dist = torch.arange(size - 1, -size, -1, dtype=torch.float32, device=device)[:, None]
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model)
    )
    pe = torch.empty(2 * size - 1, d_model, device=device)
    pe[:, 0::2] = torch.sin(dist * inv_freq)
    pe[:, 1::2] = torch.cos(dist * inv_freq)
    return pe[None]


class LinearEmbed(nn.Module):
    """Linear + LayerNorm input layer; the caller scales by sqrt(d) as the positional stage does."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.xscale = math.sqrt(odim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.xscale


class RelPositionAttention(nn.Module):
    def __init__(self, n_head: int, n_feat: int, key_bias: bool) -> None:
        super().__init__()
        self.h = n_head
        self.d_k = n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_head, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_head, self.d_k))

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(pos_emb.shape[0], -1, self.h, self.d_k).transpose(1, 2)

        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        position = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))  # [b, h, t, 2t-1]
        # Column c of ``position`` holds distance (t-1-c); query i vs key j needs distance i-j.
        idx = (t - 1) - torch.arange(t, device=x.device)[:, None] + torch.arange(t, device=x.device)[None, :]
        position = torch.gather(position, -1, idx.expand(b, self.h, t, t))

        scores = (content + position) / math.sqrt(self.d_k)
        if mask is not None:
            blocked = ~mask
            attn = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1).masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.h * self.d_k)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, idim: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden)
        self.activation = _ACTIVATIONS[activation]()
        self.w_2 = nn.Linear(hidden, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm self-attention + FFN block (the CosyVoice2 flow uses neither macaron FFN nor conv)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.output_size
        self.self_attn = RelPositionAttention(cfg.attention_heads, d, cfg.key_bias)
        self.feed_forward = FeedForward(d, cfg.linear_units, cfg.activation_type)
        self.norm_mha = nn.LayerNorm(d, eps=1e-12)
        self.norm_ff = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos_emb, mask)
        return x + self.feed_forward(self.norm_ff(x))


class PreLookaheadLayer(nn.Module):
    """Lets each token see ``lookahead`` future tokens (or the streaming context, else zeros)."""

    def __init__(self, channels: int, hidden: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, hidden, lookahead + 1)
        self.conv2 = nn.Conv1d(hidden, channels, 3)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        h = x.transpose(1, 2)
        if context is not None:
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
        h = F.pad(h, (0, x.shape[1] + self.lookahead - h.shape[2]))
        return self.convolve(x, h)

    def convolve(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] and its look-ahead input h [B, D, T + lookahead] (x, then the context or zeros)."""
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


class Upsample1D(nn.Module):
    """Nearest-neighbour repeat by ``stride`` then a causal conv."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


class UpsampleConformerEncoder(nn.Module):
    def __init__(
        self, cfg: EncoderConfig, *, lookahead: int, lookahead_hidden: int, num_up_blocks: int, stride: int
    ) -> None:
        super().__init__()
        d = cfg.output_size
        self.cfg = cfg
        self.embed = LinearEmbed(cfg.input_size, d)
        self.pre_lookahead_layer = PreLookaheadLayer(d, lookahead_hidden, lookahead)
        self.encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample1D(d, stride)
        self.up_embed = LinearEmbed(cfg.input_size, d)
        self.up_encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(num_up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def _stack(self, layers: nn.ModuleList, x: torch.Tensor, chunk: int, streaming: bool) -> torch.Tensor:
        t = x.shape[1]
        pos_emb = relative_positions(t, self.cfg.output_size, x.device)
        mask = chunk_mask(t, chunk, x.device) if streaming and chunk > 0 else None
        for layer in layers:
            x = layer(x, pos_emb, mask)
        return x

    def forward_padded(
        self, xs: torch.Tensor, lengths: list[int], contexts: list[torch.Tensor | None], streaming: list[bool]
    ) -> torch.Tensor:
        """A right-padded batch: xs [B, T, D] token embeddings, row b valid up to lengths[b], followed by
        its look-ahead ``contexts[b]`` [1, L, D] (None: zeros, as a final call) -> [B, T * stride, D],
        row b valid up to lengths[b] * stride. Every layer is causal or masked per row, so each row's
        valid part equals :meth:`forward` on that row alone."""
        batch, t, d = xs.shape
        x = self.embed(xs)
        lookahead = self.pre_lookahead_layer.lookahead
        h = x.new_zeros(batch, t + lookahead, d)
        for b, (n, ctx) in enumerate(zip(lengths, contexts, strict=True)):
            h[b, :n] = x[b, :n]
            if ctx is not None:
                h[b, n : n + ctx.shape[1]] = self.embed(ctx[0, :lookahead])
        x = self.pre_lookahead_layer.convolve(x, h.transpose(1, 2))
        chunk = self.cfg.static_chunk_size
        stride = self.up_layer.stride
        x = self._stack_masked(
            self.encoders, x, padded_chunk_mask(t, [chunk if s else 0 for s in streaming], lengths, x.device)
        )
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x = self.up_embed(x)
        x = self._stack_masked(
            self.up_encoders,
            x,
            padded_chunk_mask(
                t * stride, [chunk * stride if s else 0 for s in streaming], [n * stride for n in lengths], x.device
            ),
        )
        return self.after_norm(x)

    def _stack_masked(self, layers: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos_emb = relative_positions(x.shape[1], self.cfg.output_size, x.device)
        for layer in layers:
            x = layer(x, pos_emb, mask)
        return x

    def forward(self, xs: torch.Tensor, context: torch.Tensor | None = None, streaming: bool = False) -> torch.Tensor:
        """xs [1, T, D] token embeddings (+ look-ahead ``context`` [1, L, D]) -> [1, T * stride, D]."""
        x = self.embed(xs)
        ctx = self.embed(context) if context is not None else None
        x = self.pre_lookahead_layer(x, ctx)
        x = self._stack(self.encoders, x, self.cfg.static_chunk_size, streaming)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x = self.up_embed(x)
        x = self._stack(self.up_encoders, x, self.cfg.static_chunk_size * self.up_layer.stride, streaming)
        return self.after_norm(x)
