"""HiFT vocoder (neural source filter + iSTFTNet) of CosyVoice2: mel [B, 80, T] -> 24 kHz audio.

Submodule and parameter names follow the checkpoint's keys (``conv_pre``, ``ups.N``, ``resblocks.N``,
``source_downs.N``, ``m_source.l_linear``, ``f0_predictor.condnet.N`` ...) so the state dict loads
directly once weight norm has been folded into plain weights (see ``loader.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import HiFTConfig


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel, alpha on a linear scale."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        # the 1e-9 keeps a zero alpha finite, as in the trained model's activation
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Dilated residual stack: per dilation, Snake -> conv(dilated) -> Snake -> conv, plus skip."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class F0Predictor(nn.Module):
    """Conv stack (ELU between) + linear head predicting |f0| per mel frame."""

    def __init__(self, in_channels: int, cond_channels: int, num_convs: int, kernel_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(num_convs):
            layers.append(
                nn.Conv1d(
                    in_channels if i == 0 else cond_channels, cond_channels, kernel_size, padding=kernel_size // 2
                )
            )
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = self.condnet(mel).transpose(1, 2)
        return self.classifier(h).squeeze(-1).abs()


Generators = torch.Generator | list[torch.Generator] | None


def _draw(fn: Any, shape: tuple[int, ...], generator: Generators, like: torch.Tensor) -> torch.Tensor:
    """``fn(shape)`` from ``generator``, or row by row from a list of per-row generators."""
    if isinstance(generator, list):
        if len(generator) != shape[0]:
            raise ValueError(f"{len(generator)} generators for {shape[0]} rows")
        return torch.cat([fn((1, *shape[1:]), generator=g, device=like.device, dtype=like.dtype) for g in generator])
    return fn(shape, generator=generator, device=like.device, dtype=like.dtype)


class SourceModule(nn.Module):
    """Harmonic sine source from f0 (SineGen2 scheme) merged to one excitation channel.

    ``random_source=False`` zeroes the random initial phase of each harmonic and the additive
    Gaussian noise; only parity tests want that.
    """

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.sampling_rate = cfg.sampling_rate
        self.upsample_scale = cfg.samples_per_frame
        self.num_harmonics = cfg.nb_harmonics + 1
        self.sine_amp = cfg.nsf_alpha
        self.noise_std = cfg.nsf_sigma
        self.voiced_threshold = cfg.nsf_voiced_threshold
        self.l_linear = nn.Linear(self.num_harmonics, 1)
        self.random_source = True

    def forward(self, f0: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        """f0 [B, L, 1] at the audio rate -> excitation [B, L, 1]. ``generator`` may be a list, one per
        row: each row then draws exactly what it would draw alone (same calls, same order)."""
        harmonics = torch.arange(1, self.num_harmonics + 1, device=f0.device, dtype=f0.dtype)
        rad = (f0 * harmonics / self.sampling_rate) % 1  # phase increment per sample, in turns
        if self.random_source:
            initial = _draw(torch.rand, (f0.shape[0], self.num_harmonics), generator, f0)
            initial[:, 0] = 0  # the fundamental always starts at phase 0
            rad[:, 0, :] = rad[:, 0, :] + initial
        # Integrate the phase at the frame rate and interpolate back up, as the model was trained.
        # The phase reaches ~1e4 rad, where float32 resolves ~1e-3 rad, so the exact sequence of
        # float ops decides the last bits of the source: these are the reference's operations, in
        # its order, on the same shapes and memory layouts (so torch runs the same kernels).
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * math.pi
        phase = F.interpolate(
            phase.transpose(1, 2) * self.upsample_scale, scale_factor=float(self.upsample_scale), mode="linear"
        )
        sines = torch.sin(phase).transpose(1, 2) * self.sine_amp

        uv = (f0 > self.voiced_threshold).to(f0.dtype)
        if self.random_source:
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            noise = noise_amp * _draw(torch.randn, tuple(sines.shape), generator, f0)
            sines = sines * uv + noise
        else:
            sines = sines * uv
        return torch.tanh(self.l_linear(sines))


class HiFTGenerator(nn.Module):
    stft_window: torch.Tensor

    def __init__(
        self, cfg: HiFTConfig, *, f0_num_convs: int, f0_kernel_size: int, pre_kernel: int, post_kernel: int
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.register_buffer("stft_window", torch.hann_window(cfg.n_fft, periodic=True), persistent=False)

        self.m_source = SourceModule(cfg)
        self.f0_predictor = F0Predictor(cfg.in_channels, cfg.f0_cond_channels, f0_num_convs, f0_kernel_size)
        self.conv_pre = nn.Conv1d(cfg.in_channels, cfg.base_channels, pre_kernel, padding=pre_kernel // 2)

        self.ups = nn.ModuleList()
        for i, (rate, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)):
            self.ups.append(
                nn.ConvTranspose1d(
                    cfg.base_channels // 2**i, cfg.base_channels // 2 ** (i + 1), k, rate, padding=(k - rate) // 2
                )
            )

        # The source STFT (n_fft + 2 channels: real and imaginary halves) is brought down to the rate
        # of each upsampling stage: stage i sees the product of the rates of the stages after it.
        spec_channels = cfg.n_fft + 2
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        n_up = len(cfg.upsample_rates)
        for i, (k, d) in enumerate(
            zip(cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes, strict=True)
        ):
            ch = cfg.base_channels // 2 ** (i + 1)
            stride = math.prod(cfg.upsample_rates[i + 1 :])
            if stride == 1:
                self.source_downs.append(nn.Conv1d(spec_channels, ch, 1))
            else:
                self.source_downs.append(nn.Conv1d(spec_channels, ch, stride * 2, stride, padding=stride // 2))
            self.source_resblocks.append(ResBlock(ch, k, d))

        self.resblocks = nn.ModuleList()
        for i in range(n_up):
            ch = cfg.base_channels // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(ResBlock(ch, k, d))
        self.conv_post = nn.Conv1d(ch, spec_channels, post_kernel, padding=post_kernel // 2)

    def _stft(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(
            x, self.cfg.n_fft, self.cfg.hop_len, self.cfg.n_fft, window=self.stft_window, return_complex=True
        )
        return torch.cat([spec.real, spec.imag], dim=1)

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        magnitude = magnitude.clamp(max=1e2)  # keeps exp() of a bad frame from blowing up the sum
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, self.cfg.n_fft, self.cfg.hop_len, self.cfg.n_fft, window=self.stft_window)

    def source(self, mel: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        """Excitation [B, 1, T * samples_per_frame] for mel [B, C, T]."""
        return self.excitation(self.f0_predictor(mel), generator)

    def excitation(self, f0: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        """Excitation [B, 1, T * samples_per_frame] for f0 [B, T] at the frame rate."""
        f0 = F.interpolate(f0[:, None], scale_factor=float(self.cfg.samples_per_frame), mode="nearest")
        return self.m_source(f0.transpose(1, 2), generator).transpose(1, 2)

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        s_spec = self._stft(source.squeeze(1))
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")  # one frame to line up with the source STFT
            x = x + self.source_resblocks[i](self.source_downs[i](s_spec))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs = xs + block(x)
            x = xs / self.num_kernels
        x = self.conv_post(F.leaky_relu(x))  # default slope here, as trained
        half = cfg.n_fft // 2 + 1
        audio = self._istft(torch.exp(x[:, :half]), torch.sin(x[:, half:]))
        return audio.clamp(-cfg.audio_limit, cfg.audio_limit)

    def forward(
        self,
        mel: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        generator: Generators = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, C, T] -> (audio [B, T * samples_per_frame], source [B, 1, same]).

        ``cache_source`` (the previous chunk's last source samples) replaces the head of the new
        source so that the excitation stays continuous across streaming chunks. ``generator`` drives
        the random source (the global RNG if None; callers in this package always pass one), or one
        generator per row for a batch of streams.
        """
        s = self.source(mel, generator)
        if cache_source is not None and cache_source.shape[2] > 0:
            s[:, :, : cache_source.shape[2]] = cache_source
        return self.decode(mel, s), s
