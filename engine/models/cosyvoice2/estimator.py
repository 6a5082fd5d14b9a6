"""The flow-matching vector-field estimator: a causal 1-D U-Net with transformer blocks.

Structure: resnet + transformer blocks at the top level (down), mid blocks, one up level with a skip
connection, final block and projection. Every conv is causal (left padded), and in streaming mode
attention is limited to static chunks, so a prefix of mel frames does not depend on later frames
beyond its chunk. Submodule names mirror the checkpoint's ``decoder.estimator.*`` keys.
"""

from __future__ import annotations

import math
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from .config import EstimatorConfig
from .encoder import chunk_mask

MASKED = -1.0e10
"""Additive attention bias of a hidden key (the value training used)."""


class Estimator(Protocol):
    """The estimator's masked call: x, mu, cond [B, C, T], t [B], spks [B, C], lengths [B] (valid frames per
    row) and chunks [B] (attention chunk in frames per row, 0 for full attention) -> velocity [B, C, T].
    :meth:`CausalConditionalDecoder.forward_masked` is the torch one; a TensorRT engine is another."""

    def __call__(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        lengths: torch.Tensor,
        chunks: torch.Tensor,
    ) -> torch.Tensor: ...


def attention_bias(frames: int, lengths: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] additive bias: key j is visible to query i of row b iff j < lengths[b] and, when
    chunks[b] > 0, j is before the end of i's chunk. Built from shapes with tensor ops only, so it
    exports to ONNX with a dynamic T and batch."""
    pos = torch.arange(frames, device=lengths.device)
    chunk = chunks[:, None]
    limit = torch.where(
        chunk > 0,
        torch.div(pos[None], chunk.clamp(min=1), rounding_mode="floor") * chunk + chunk,
        torch.full_like(chunk, frames),
    )
    limit = torch.minimum(limit, lengths[:, None]).clamp(min=1)  # [B, T]; padded rows still see key 0
    visible = pos[None, None, :] < limit[:, :, None]
    return torch.where(visible, 0.0, MASKED)[:, None]


class CausalConv1d(nn.Conv1d):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of a [B, C, T] tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        # indices 0 and 2 carry weights in the checkpoint (1 was a transpose module there)
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), nn.Identity(), _ChannelLayerNorm(dim_out), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        h = self.block1(x) + self.mlp(t_emb).unsqueeze(-1)
        return self.block2(h) + self.res_conv(x)


class Attention(nn.Module):
    """Multi-head self-attention with bias-free q/k/v projections (diffusers layout)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x)), attn_mask=bias
        )
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, -1))


class GELUProj(nn.Module):
    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, act_fn: str, mult: int = 4) -> None:
        super().__init__()
        if act_fn != "gelu":
            raise ValueError(f"estimator act_fn {act_fn!r} is not supported (CosyVoice2 uses 'gelu')")
        # index 1 was a dropout in the checkpoint's layout
        self.net = nn.Sequential(GELUProj(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, cfg: EstimatorConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, cfg.num_heads, cfg.attention_head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, cfg.act_fn)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), bias)
        return x + self.ff(self.norm3(x))


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.linear_1 = nn.Linear(in_channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.in_channels // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        arg = 1000 * t[:, None] * freqs[None]
        emb = torch.cat([arg.sin(), arg.cos()], dim=-1)
        return self.linear_2(F.silu(self.linear_1(emb)))


class CausalConditionalDecoder(nn.Module):
    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        if len(cfg.channels) != 1:
            # Released CosyVoice2 uses one U-Net level; deeper ones would need strided down/up convs.
            raise ValueError(f"estimator channels {cfg.channels}: only a single level is supported")
        self.cfg = cfg
        ch = cfg.channels[0]
        time_dim = ch * 4
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_dim)

        def transformers() -> nn.ModuleList:
            return nn.ModuleList(TransformerBlock(ch, cfg) for _ in range(cfg.n_blocks))

        self.down_blocks = nn.ModuleList(
            [
                nn.ModuleList(
                    [CausalResnetBlock1D(cfg.in_channels, ch, time_dim), transformers(), CausalConv1d(ch, ch, 3)]
                )
            ]
        )
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([CausalResnetBlock1D(ch, ch, time_dim), transformers()]) for _ in range(cfg.num_mid_blocks)
        )
        self.up_blocks = nn.ModuleList(
            [nn.ModuleList([CausalResnetBlock1D(2 * ch, ch, time_dim), transformers(), CausalConv1d(ch, ch, 3)])]
        )
        self.final_block = CausalBlock1D(ch, ch)
        self.final_proj = nn.Conv1d(ch, cfg.out_channels, 1)

    @staticmethod
    def _level(level: nn.Module, h: torch.Tensor, t_emb: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Resnet, then the transformer blocks, of one level laid out as [resnet, blocks, (resample)]."""
        parts = cast(nn.ModuleList, level)
        h = parts[0](h, t_emb).transpose(1, 2)
        for block in cast(nn.ModuleList, parts[1]):
            h = block(h, bias)
        return h.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
    ) -> torch.Tensor:
        """Velocity for x [B, C, T] at time t [B], conditioned on mu, speaker and prompt-mel cond."""
        bias = None
        if streaming:
            # Additive bias rather than a bool mask, with the same large negative value as training.
            allowed = chunk_mask(x.shape[2], self.cfg.static_chunk_size, x.device)
            bias = (~allowed).to(x.dtype) * MASKED
        return self._run(x, mu, t, spks, cond, bias)

    def forward_masked(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        lengths: torch.Tensor,
        chunks: torch.Tensor,
    ) -> torch.Tensor:
        """A right-padded batch with per-row valid lengths and attention chunks (see :class:`Estimator`).
        Every conv is causal, so row b's first lengths[b] frames equal :meth:`forward` on them alone."""
        return self._run(x, mu, t, spks, cond, attention_bias(x.shape[2], lengths, chunks).to(x.dtype))

    def _run(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        t_emb = self.time_mlp(t)
        h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[2]), cond], dim=1)

        down = cast(nn.ModuleList, self.down_blocks[0])
        skip = self._level(down, h, t_emb, bias)
        h = down[2](skip)
        for mid in self.mid_blocks:
            h = self._level(mid, h, t_emb, bias)
        up = cast(nn.ModuleList, self.up_blocks[0])
        h = torch.cat([h[:, :, : skip.shape[2]], skip], dim=1)
        h = up[2](self._level(up, h, t_emb, bias))
        return self.final_proj(self.final_block(h))
