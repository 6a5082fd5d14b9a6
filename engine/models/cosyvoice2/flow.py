"""Speech tokens -> mel: token encoder + conditional flow matching (Euler ODE with CFG).

The prompt's tokens are prepended to the new tokens, the prompt's mel is given as condition for
its frames, and the prompt frames are cut from the output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import CFMConfig, FlowConfig
from .encoder import UpsampleConformerEncoder
from .estimator import CausalConditionalDecoder, Estimator

log = logging.getLogger(__name__)

N_TIMESTEPS = 10
"""Euler steps per call; the reference's token2wav always uses 10."""

NOISE_SEED = 0
NOISE_SECONDS = 300
"""The flow starts from one fixed noise draw, ``randn([1, mel_bins, mel_rate * 300])`` after
``manual_seed(0)``, of which each call uses the first frames. Fixed noise makes the streaming
chunks consistent with each other (a frame gets the same noise in every call that covers it)."""


@dataclass(frozen=True)
class FlowItem:
    """One flow call of a batch: the arguments of :meth:`CausalMaskedDiffWithXvec.forward`."""

    token: torch.Tensor
    prompt_token: torch.Tensor
    prompt_feat: torch.Tensor
    embedding: torch.Tensor
    streaming: bool
    finalize: bool


class CausalConditionalCFM(nn.Module):
    rand_noise: torch.Tensor

    def __init__(self, cfg: CFMConfig, estimator: CausalConditionalDecoder, mel_bins: int, mel_rate: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.estimator = estimator
        self.accelerated: Estimator | None = None
        """A drop-in for the estimator's masked call (a TensorRT engine); None runs the torch module."""
        self.fp32_fallback: Estimator | None = None
        """Set with a reduced-precision ``accelerated``: what re-runs a call whose output is not finite."""
        gen = torch.Generator().manual_seed(NOISE_SEED)  # a private generator: global RNG untouched
        noise = torch.randn([1, mel_bins, mel_rate * NOISE_SECONDS], generator=gen)
        self.register_buffer("rand_noise", noise, persistent=False)

    def time_span(self, n_timesteps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        t = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
        if self.cfg.t_scheduler == "cosine":
            t = 1 - torch.cos(t * 0.5 * torch.pi)  # smaller steps near the noise end
        return t

    def forward(
        self, mu: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor, n_timesteps: int, streaming: bool
    ) -> torch.Tensor:
        """mu, cond [1, C, T], spks [1, S] -> mel [1, C, T]."""
        frames = mu.shape[2]
        if frames > self.rand_noise.shape[2]:
            raise ValueError(f"flow input of {frames} frames exceeds the {self.rand_noise.shape[2]}-frame noise")
        if self.accelerated is not None:
            chunk = self.estimator.cfg.static_chunk_size if streaming else 0
            return self.forward_padded(mu, spks, cond, n_timesteps, [frames], [chunk])
        x = self.rand_noise[:, :, :frames].to(mu)
        t_span = self.time_span(n_timesteps, mu.device, mu.dtype)

        # Classifier-free guidance: one batch of two, the second row unconditioned (zeros).
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)])
        rate = self.cfg.inference_cfg_rate
        # Advance t by accumulating dt (not by indexing t_span) to round exactly as the reference.
        t = t_span[0:1]
        dt = t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            v = self.estimator(torch.cat([x, x]), mu_in, t.expand(2), spks_in, cond_in, streaming)
            v_cond, v_uncond = v[:1], v[1:]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x

    def forward_padded(
        self,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_timesteps: int,
        lengths: list[int],
        chunks: list[int],
    ) -> torch.Tensor:
        """A right-padded batch: mu, cond [B, C, T], spks [B, S]; row b has lengths[b] valid frames and
        attends in chunks of chunks[b] frames (0: full attention). Each row's valid frames equal
        :meth:`forward` on that row alone (causal convs, per-row masks, the same fixed noise)."""
        batch, _, frames = mu.shape
        if frames > self.rand_noise.shape[2]:
            raise ValueError(f"flow input of {frames} frames exceeds the {self.rand_noise.shape[2]}-frame noise")
        x = self.rand_noise[:, :, :frames].to(mu).expand(batch, -1, -1)
        t_span = self.time_span(n_timesteps, mu.device, mu.dtype)
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)])
        lengths_in = torch.tensor(lengths + lengths, device=mu.device)
        chunks_in = torch.tensor(chunks + chunks, device=mu.device)
        accelerated = self.accelerated
        x = self._euler(
            accelerated or self.estimator.forward_masked, x, mu_in, spks_in, cond_in, t_span, lengths_in, chunks_in
        )
        if accelerated is not None and self.fp32_fallback is not None and not bool(torch.isfinite(x).all()):
            # One check per flow call (the caller reads the audio back anyway), none per Euler step.
            log.warning("the fp16 TensorRT estimator produced non-finite mel; switching to torch fp32 for good")
            self.accelerated, fallback, self.fp32_fallback = None, self.fp32_fallback, None
            x = self.rand_noise[:, :, :frames].to(mu).expand(batch, -1, -1)
            x = self._euler(fallback, x, mu_in, spks_in, cond_in, t_span, lengths_in, chunks_in)
        return x

    def _euler(
        self,
        estimator: Estimator,
        x: torch.Tensor,
        mu_in: torch.Tensor,
        spks_in: torch.Tensor,
        cond_in: torch.Tensor,
        t_span: torch.Tensor,
        lengths_in: torch.Tensor,
        chunks_in: torch.Tensor,
    ) -> torch.Tensor:
        batch = x.shape[0]
        rate = self.cfg.inference_cfg_rate
        t = t_span[0:1]
        dt = t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            v = estimator(torch.cat([x, x]), mu_in, t.expand(2 * batch), spks_in, cond_in, lengths_in, chunks_in)
            v_cond, v_uncond = v[:batch], v[batch:]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x


class CausalMaskedDiffWithXvec(nn.Module):
    def __init__(
        self,
        cfg: FlowConfig,
        *,
        lookahead_hidden: int,
        num_up_blocks: int,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(
            cfg.encoder,
            lookahead=cfg.pre_lookahead_len,
            lookahead_hidden=lookahead_hidden,
            num_up_blocks=num_up_blocks,
            stride=cfg.token_mel_ratio,
        )
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = CausalConditionalCFM(
            cfg.cfm,
            CausalConditionalDecoder(cfg.estimator),
            mel_bins=cfg.output_size,
            mel_rate=cfg.input_frame_rate * cfg.token_mel_ratio,
        )

    def forward(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        streaming: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """Mel [1, C, T_new] for ``token`` [1, N] after the prompt (tokens [1, P], mel [1, 2P, C]).

        ``finalize=False``: the last ``pre_lookahead_len`` tokens serve only as look-ahead context,
        so the output covers N - pre_lookahead_len tokens. ``streaming`` selects chunked attention.
        """
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        tokens = torch.cat([prompt_token, token], dim=1).long().clamp(min=0)
        x = self.input_embedding(tokens)
        context = None
        if not finalize:
            x, context = x[:, : -self.cfg.pre_lookahead_len], x[:, -self.cfg.pre_lookahead_len :]
        h = self.encoder_proj(self.encoder(x, context, streaming))

        prompt_frames = prompt_feat.shape[1]
        cond = torch.zeros_like(h)
        cond[:, :prompt_frames] = prompt_feat
        mel = self.decoder(h.transpose(1, 2), spks, cond.transpose(1, 2), N_TIMESTEPS, streaming)
        return mel[:, :, prompt_frames:]

    def forward_batch(self, items: list[FlowItem]) -> list[torch.Tensor]:
        """Several calls of :meth:`forward` in one padded batch; each result equals its own call."""
        if len(items) == 1:
            i = items[0]
            return [self.forward(i.token, i.prompt_token, i.prompt_feat, i.embedding, i.streaming, i.finalize)]
        lookahead = self.cfg.pre_lookahead_len
        embedded, contexts, lengths = [], [], []
        for i in items:
            x = self.input_embedding(torch.cat([i.prompt_token, i.token], dim=1).long().clamp(min=0))
            context = None
            if not i.finalize:
                x, context = x[:, :-lookahead], x[:, -lookahead:]
            embedded.append(x[0])
            contexts.append(context)
            lengths.append(x.shape[1])
        xs = nn.utils.rnn.pad_sequence(embedded, batch_first=True)
        h = self.encoder_proj(self.encoder.forward_padded(xs, lengths, contexts, [i.streaming for i in items]))
        ratio = self.encoder.up_layer.stride
        frames = [n * ratio for n in lengths]
        cond = torch.zeros_like(h)
        spks = []
        for b, i in enumerate(items):
            cond[b, : i.prompt_feat.shape[1]] = i.prompt_feat[0]
            spks.append(self.spk_embed_affine_layer(F.normalize(i.embedding, dim=1)))
        chunk = self.decoder.estimator.cfg.static_chunk_size
        mel = self.decoder.forward_padded(
            h.transpose(1, 2),
            torch.cat(spks),
            cond.transpose(1, 2),
            N_TIMESTEPS,
            frames,
            [chunk if i.streaming else 0 for i in items],
        )
        return [mel[b : b + 1, :, i.prompt_feat.shape[1] : frames[b]] for b, i in enumerate(items)]
