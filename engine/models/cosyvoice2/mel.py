"""Prompt-speech mel features (the flow's condition): log of a Slaney mel filterbank applied to the
STFT magnitude, as Matcha-TTS's ``mel_spectrogram`` computes it with librosa's filters."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .config import MelConfig

# Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz >= _MIN_LOG_HZ:
        return float(_MIN_LOG_MEL + np.log(hz / _MIN_LOG_HZ) / _LOGSTEP)
    return hz / _F_SP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = _F_SP * mels
    log_part = mels >= _MIN_LOG_MEL
    hz[log_part] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels[log_part] - _MIN_LOG_MEL))
    return hz


def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters, area-normalised (librosa's defaults)."""
    fft_freqs = np.arange(n_fft // 2 + 1) * (1.0 / (n_fft * (1.0 / sr)))
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    # librosa stores the triangles in float32 before scaling; round at the same two points.
    weights = np.maximum(0, np.minimum(lower, upper)).astype(np.float32)
    enorm = 2.0 / (mel_f[2:] - mel_f[:-2])
    weights = (weights.astype(np.float64) * enorm[:, None]).astype(np.float32)
    return torch.from_numpy(weights)


class MelExtractor:
    def __init__(self, cfg: MelConfig) -> None:
        self.cfg = cfg
        self.basis = slaney_mel_filterbank(cfg.sampling_rate, cfg.n_fft, cfg.num_mels, cfg.fmin, cfg.fmax)
        self.window = torch.hann_window(cfg.win_size)

    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, N] in [-1, 1] at ``sampling_rate`` -> log-mel [B, num_mels, frames]."""
        cfg = self.cfg
        pad = (cfg.n_fft - cfg.hop_size) // 2  # so that frames land on hop centres without center=True
        x = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
        spec = torch.stft(
            x,
            cfg.n_fft,
            hop_length=cfg.hop_size,
            win_length=cfg.win_size,
            window=self.window.to(x.device),
            center=cfg.center,
            return_complex=True,
        )
        magnitude = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)
        mel = torch.matmul(self.basis.to(x.device), magnitude)
        return torch.log(mel.clamp(min=1e-5))
