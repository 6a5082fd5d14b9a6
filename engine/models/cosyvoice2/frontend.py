"""CosyVoice2's front end: text -> LM text ids, prompt audio -> speech tokens, speaker embedding and mel.

Text: segments come from the engine's :class:`engine.text.Segmenter` (which already applied
:func:`engine.text.normalize`, spoken forms included); :func:`normalize_segment` adds what this model's LM expects on
top (light clean-up of Chinese text), then a
:class:`TextTokenizer` turns the segment into Qwen2 ids.

Prompt audio (an uploaded file): decoded with PyAV, mixed down to mono, checked (length, level,
rate), resampled with soxr to 16 kHz (speech tokenizer, speaker embedding) and to the model's rate
(the flow's prompt mel). Three features come out of it:

- speech tokens: Whisper's 128-bin log-mel at 16 kHz -> ``speech_tokenizer_v2.onnx``;
- speaker embedding: 80-bin Kaldi fbank at 16 kHz, mean-normalised over time -> ``campplus.onnx``;
- prompt mel: :class:`~engine.models.cosyvoice2.mel.MelExtractor` at the model's rate, trimmed
  with the tokens so that it has exactly two frames per token (the flow's ratio).
"""

from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from rtvoice.engine.audio.resample import resample
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.cosyvoice2.info import MAX_RECORDING_BYTES
from rtvoice.engine.text import normalize

from .mel import MelExtractor, slaney_mel_filterbank

log = logging.getLogger(__name__)

# -- text tokenizers ------------------------------------------------------------------------------

END_OF_PROMPT = "<|endofprompt|>"
"""Ends an instruction in instruct2 mode: ``instruct_text + END_OF_PROMPT`` is the LM's prompt text."""

# Tokens CosyVoice2 adds to the Qwen2 tokenizer at load. New tokens get ids after the base vocabulary
# in this order (``<|endofprompt|>`` becomes 151646 with CosyVoice-BlankEN), so the order is part of
# the model's interface and must not change. The first two already exist in Qwen2's vocabulary.
COSYVOICE2_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    END_OF_PROMPT,
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


class TextTokenizer(Protocol):
    kind: str

    def encode(self, text: str) -> list[int]: ...


class QwenTokenizer:
    """The Qwen2 BPE tokenizer of ``CosyVoice-BlankEN`` (transformers), plus CosyVoice2's special tokens."""

    kind = "qwen2"

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self._tokenizer.add_special_tokens(
            {
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": list(COSYVOICE2_SPECIAL_TOKENS),
            }
        )
        # A fast tokenizer's Rust core refuses concurrent use ("Already borrowed"); calls are short.
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self._tokenizer(text)["input_ids"])


class ByteFallbackTokenizer:
    """FALLBACK FOR TEST FIXTURES ONLY: a model directory without tokenizer files (the random-weight
    parity fixture ships none) still needs text ids. Each UTF-8 byte ``b`` of the text becomes id
    ``b``; CosyVoice2's special tokens (:data:`COSYVOICE2_SPECIAL_TOKENS`, in order) become ids 256,
    257, ...; every id is below the backbone's vocabulary size. A trained model reads these ids as
    unrelated Qwen2 tokens, so its speech would be nonsense: real directories ship the tokenizer."""

    kind = "byte-fallback"

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256 + len(COSYVOICE2_SPECIAL_TOKENS):
            raise ValueError(f"a vocabulary of {vocab_size} ids is too small for the byte-level fallback tokenizer")
        self._special = {token: 256 + i for i, token in enumerate(COSYVOICE2_SPECIAL_TOKENS)}
        self._pattern = re.compile("|".join(re.escape(t) for t in sorted(self._special, key=len, reverse=True)))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        position = 0
        for match in self._pattern.finditer(text):
            ids.extend(text[position : match.start()].encode("utf-8"))
            ids.append(self._special[match.group(0)])
            position = match.end()
        ids.extend(text[position:].encode("utf-8"))
        return ids


def has_tokenizer_files(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(directory: Path, vocab_size: int) -> TextTokenizer:
    """The Qwen2 tokenizer when ``directory`` has its files, else the byte-level test fallback (with a warning)."""
    if has_tokenizer_files(directory):
        return QwenTokenizer(directory)
    log.warning(
        "%s has no tokenizer files: using the byte-level FALLBACK tokenizer meant for test fixtures; "
        "a trained model will not speak the text correctly",
        directory,
    )
    return ByteFallbackTokenizer(vocab_size)


# -- text normalisation ---------------------------------------------------------------------------

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_MARKUP = re.compile(r"<\|[^|<>]*\|>")
_BLANK_BETWEEN = re.compile(r"(?<=[^\x00-\x7f]) +|(?<!\s) +(?=[^\x00-\x7f])")
_BRACKETS = str.maketrans(
    {
        "\u3010": "",
        "\u3011": "",
        "\u300a": "",
        "\u300b": "",
        "`": "",
        "(": "\uff0c",
        ")": "\uff0c",
        "\uff08": "\uff0c",
        "\uff09": "\uff0c",
    }
)
_TRAILING_COMMAS = re.compile(r"[\uff0c,\u3001]+$")


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def normalize_segment(text: str) -> str:
    """What the LM reads for one segment (already through :func:`engine.text.normalize`).

    Text with CosyVoice markup (``<|en|>``, ``<|endofprompt|>``) is left as it is, as the reference
    does. Chinese (or Japanese, Korean) text: blanks next to non-ASCII characters dropped, brackets
    turned into commas or removed, a trailing comma becomes a full stop. Numbers, money and dates are the
    segmenter's spoken form already (``engine/spoken.py``), or as sent where the request says ``normalize: false``.
    """
    text = text.strip()
    if _MARKUP.search(text):
        return text
    if has_cjk(text):
        text = _BLANK_BETWEEN.sub("", text).translate(_BRACKETS)
        return _TRAILING_COMMAS.sub("\u3002", text.strip().lstrip("\uff0c,\u3001"))
    return text


# -- prompt audio ---------------------------------------------------------------------------------

MAX_PROMPT_SECONDS = 30.0
"""The speech tokenizer takes at most 30 s (Whisper's window)."""
MIN_PROMPT_SECONDS = 0.5
MIN_PROMPT_RATE = 16_000
SILENCE_RMS = 1e-3
"""A prompt quieter than this (about -60 dBFS RMS) carries no voice to copy."""
MAX_UPLOAD_BYTES = MAX_RECORDING_BYTES
FRONTEND_RATE = 16_000


@dataclass(frozen=True)
class PromptAudio:
    """A checked prompt recording: mono float32 at 16 kHz and at the model's rate."""

    audio_16k: np.ndarray
    audio_model_rate: np.ndarray
    source_rate: int
    duration_s: float


def _audio_error(message: str, code: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def decode_audio(data: bytes, param: str = "prompt_wav") -> tuple[np.ndarray, int]:
    """Any audio file PyAV can read -> (mono float32 samples, sample rate); channels are averaged."""
    import av

    if not data:
        raise _audio_error(f"'{param}' is empty", "invalid_audio", param)
    if len(data) > MAX_UPLOAD_BYTES:
        raise _audio_error(f"'{param}' is larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MB", "audio_too_large", param)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise _audio_error(f"'{param}' has no audio stream", "invalid_audio", param)
            stream = container.streams.audio[0]
            rate = stream.rate or stream.codec_context.sample_rate
            to_float = av.AudioResampler(format="fltp")  # planar float, same layout and rate
            planes: list[np.ndarray] = []
            decoded, enough = 0, (MAX_PROMPT_SECONDS + 1) * (rate or 1)
            for frame in container.decode(stream):
                for converted in to_float.resample(frame):
                    planes.append(converted.to_ndarray())
                    decoded += planes[-1].shape[1]
                if decoded > enough:
                    break  # long enough to know it is too long: stop decoding
            else:
                for converted in to_float.resample(None):
                    planes.append(converted.to_ndarray())
    except InvalidRequest:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as error:
        raise _audio_error(f"'{param}' is not audio PyAV can decode: {error}", "invalid_audio", param) from error
    if not planes or not rate:
        raise _audio_error(f"'{param}' holds no audio samples", "invalid_audio", param)
    audio = np.concatenate(planes, axis=1).astype(np.float32).mean(axis=0)
    return np.ascontiguousarray(audio, dtype=np.float32), int(rate)


def load_prompt_audio(data: bytes, model_rate: int, param: str = "prompt_wav") -> PromptAudio:
    """Decode and check a prompt recording; raises InvalidRequest (400) with a clear message."""
    audio, rate = decode_audio(data, param)
    duration = len(audio) / rate
    if rate < MIN_PROMPT_RATE:
        raise _audio_error(
            f"'{param}' is sampled at {rate} Hz; prompts need at least {MIN_PROMPT_RATE} Hz",
            "sample_rate_too_low",
            param,
        )
    if duration > MAX_PROMPT_SECONDS:
        raise _audio_error(
            f"'{param}' is {duration:.1f} s long; prompts may be at most {MAX_PROMPT_SECONDS:.0f} s",
            "audio_too_long",
            param,
        )
    if duration < MIN_PROMPT_SECONDS:
        raise _audio_error(
            f"'{param}' is {duration:.2f} s long; prompts need at least {MIN_PROMPT_SECONDS} s",
            "audio_too_short",
            param,
        )
    level = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    if level < SILENCE_RMS:
        raise _audio_error(f"'{param}' is silent (RMS {level:.1e}); record the voice to copy", "audio_silent", param)
    return PromptAudio(
        audio_16k=resample(audio, rate, FRONTEND_RATE).astype(np.float32),
        audio_model_rate=resample(audio, rate, model_rate).astype(np.float32),
        source_rate=rate,
        duration_s=duration,
    )


# -- features -------------------------------------------------------------------------------------

WHISPER_N_FFT = 400
WHISPER_HOP = 160
WHISPER_MELS = 128
_WHISPER_FILTERS = slaney_mel_filterbank(FRONTEND_RATE, WHISPER_N_FFT, WHISPER_MELS, 0.0, FRONTEND_RATE / 2)
_WHISPER_WINDOW = torch.hann_window(WHISPER_N_FFT)


def whisper_log_mel(audio_16k: np.ndarray) -> np.ndarray:
    """Whisper's log-mel: centred STFT (400-point periodic Hann, hop 160), power, the last frame
    dropped, librosa's Slaney mel filters (128 bins), log10 floored at 1e-10 and at 8 below the
    maximum, then ``(x + 4) / 4``. Returns [1, 128, frames] float32."""
    x = torch.from_numpy(np.ascontiguousarray(audio_16k, dtype=np.float32))
    spec = torch.stft(x, WHISPER_N_FFT, WHISPER_HOP, window=_WHISPER_WINDOW, return_complex=True)
    power = spec[..., :-1].abs() ** 2
    log_mel = torch.clamp(_WHISPER_FILTERS @ power, min=1e-10).log10()
    log_mel = torch.maximum(log_mel, log_mel.max() - 8.0)
    return ((log_mel + 4.0) / 4.0)[None].numpy()


def kaldi_fbank(audio_16k: np.ndarray, num_bins: int = 80) -> np.ndarray:
    """Kaldi's fbank as ``torchaudio.compliance.kaldi.fbank(wave, num_mel_bins=80, dither=0,
    sample_frequency=16000)`` computes it on samples in [-1, 1] (25 ms Povey windows every 10 ms,
    pre-emphasis 0.97, DC removed, power spectrum, 20 Hz to Nyquist, natural log), minus its mean over
    time. Returns [frames, num_bins] float32."""
    import kaldi_native_fbank as knf

    options = knf.FbankOptions()
    options.frame_opts.samp_freq = FRONTEND_RATE
    options.frame_opts.dither = 0.0
    options.frame_opts.snip_edges = True
    options.frame_opts.window_type = "povey"
    options.frame_opts.preemph_coeff = 0.97
    options.frame_opts.remove_dc_offset = True
    options.frame_opts.round_to_power_of_two = True
    options.mel_opts.num_bins = num_bins
    options.mel_opts.low_freq = 20.0
    options.mel_opts.high_freq = 0.0  # 0: the Nyquist frequency
    options.use_energy = False
    options.use_log_fbank = True
    options.use_power = True
    fbank = knf.OnlineFbank(options)
    fbank.accept_waveform(FRONTEND_RATE, np.asarray(audio_16k, dtype=np.float32).tolist())
    fbank.input_finished()
    frames = fbank.num_frames_ready
    if frames == 0:
        return np.zeros((0, num_bins), dtype=np.float32)
    feats = np.stack([fbank.get_frame(i) for i in range(frames)]).astype(np.float32)
    return feats - feats.mean(axis=0, keepdims=True)


@dataclass(frozen=True)
class PromptFeatures:
    """A speaker as the model sees it. Empty tensors (shape [1, 0] / [1, 0, C]) where a source lacks a part."""

    embedding: torch.Tensor
    """Speaker x-vector [1, 192] (CAM++)."""
    speech_tokens: torch.Tensor
    """Prompt speech tokens [1, S] int32."""
    speech_feat: torch.Tensor
    """Prompt mel [1, 2S, 80] at the model's rate."""
    prompt_text: str = ""
    prompt_text_ids: torch.Tensor | None = None
    """Text ids [1, P] int32 of ``prompt_text`` (what was said in the prompt)."""

    def to(self, device: torch.device | str) -> PromptFeatures:
        return PromptFeatures(
            embedding=self.embedding.to(device),
            speech_tokens=self.speech_tokens.to(device),
            speech_feat=self.speech_feat.to(device),
            prompt_text=self.prompt_text,
            prompt_text_ids=None if self.prompt_text_ids is None else self.prompt_text_ids.to(device),
        )


def ids_tensor(ids: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor([list(ids)], dtype=torch.int32, device=device).reshape(1, -1)


class Frontend:
    """Text ids and prompt features for one loaded model; stateless apart from its sessions."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        mel: MelExtractor,
        model_rate: int,
        token_mel_ratio: int,
        speech_tokenizer: Any | None,
        campplus: Any | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.mel = mel
        self.model_rate = model_rate
        self.token_mel_ratio = token_mel_ratio
        self.speech_tokenizer = speech_tokenizer
        self.campplus = campplus

    @property
    def can_clone(self) -> bool:
        """True when the directory has both ONNX front ends (speech tokenizer, CAM++)."""
        return self.speech_tokenizer is not None and self.campplus is not None

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def speech_tokens(self, audio_16k: np.ndarray) -> np.ndarray:
        assert self.speech_tokenizer is not None
        mel = whisper_log_mel(audio_16k)
        inputs = self.speech_tokenizer.get_inputs()
        (tokens, *_) = self.speech_tokenizer.run(
            None,
            {
                inputs[0].name: mel,
                inputs[1].name: np.array([mel.shape[2]], dtype=np.int32),
            },
        )
        return np.asarray(tokens).reshape(-1).astype(np.int32)

    def speaker_embedding(self, audio_16k: np.ndarray) -> np.ndarray:
        assert self.campplus is not None
        feats = kaldi_fbank(audio_16k)
        (embedding, *_) = self.campplus.run(None, {self.campplus.get_inputs()[0].name: feats[None]})
        return np.asarray(embedding, dtype=np.float32).reshape(1, -1)

    def prompt_mel(self, audio_model_rate: np.ndarray) -> torch.Tensor:
        """[1, frames, 80] prompt mel at the model's rate."""
        with torch.inference_mode():
            mel = self.mel(torch.from_numpy(audio_model_rate)[None])
        return mel.transpose(1, 2).contiguous()

    def features(self, audio: PromptAudio, prompt_text: str = "") -> PromptFeatures:
        """All prompt features of a checked recording, as the reference's zero-shot front end makes them."""
        if not self.can_clone:
            raise RuntimeError("this model directory has no speech tokenizer / campplus ONNX models")
        tokens = self.speech_tokens(audio.audio_16k)
        feat = self.prompt_mel(audio.audio_model_rate)
        # Exactly ``token_mel_ratio`` mel frames per token: the flow cuts the prompt's frames by that count.
        n = min(feat.shape[1] // self.token_mel_ratio, len(tokens))
        text = normalize_segment(normalize(prompt_text, "mul")) if prompt_text.strip() else ""
        return PromptFeatures(
            embedding=torch.from_numpy(self.speaker_embedding(audio.audio_16k)),
            speech_tokens=torch.from_numpy(tokens[:n].copy())[None],
            speech_feat=feat[:, : n * self.token_mel_ratio].clone(),
            prompt_text=text,
            prompt_text_ids=ids_tensor(self.text_ids(text)) if text else None,
        )
