"""One loaded CosyVoice2 model and everything that speaks with it.

:class:`CosyVoice2Service` owns the weights (:class:`~engine.models.cosyvoice2.model.CosyVoice2Model`),
the front end, the saved speakers (``spk2info.pt``) and the registered voices (a directory of
``*.pt`` files outside the model directory); it makes :class:`CosyVoice2Voice` objects for each of
them and for one-off prompts, and runs the batched steps of all of them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rtvoice.engine.models.base import VoiceInfo

from .frontend import Frontend, PromptAudio, PromptFeatures, ids_tensor, load_prompt_audio, load_tokenizer
from .files import CosyVoiceDirError, check_model_dir
from .loader import QWEN_DIR
from .model import CosyVoice2Model
from .voice import (
    MAX_TOKEN_TEXT_RATIO,
    MIN_TOKEN_TEXT_RATIO,
    CosyVoice2Voice,
    DecodeJob,
    LMResult,
    Mode,
    PrefillJob,
    Token2WavJob,
)
from .voice_store import SavedVoice, VoiceStore

log = logging.getLogger(__name__)

MODEL_NAME = "cosyvoice2"
LANGUAGE = "mul"
"""CosyVoice2 speaks Chinese, English, Japanese, Korean and Cantonese (ISO 639 'mul')."""


def resolve_device(name: str) -> torch.device:
    name = name.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CosyVoiceDirError(f"RTVOICE_COSYVOICE_DEVICE={name}, but torch sees no CUDA device")
    return device


def _empty_features(embedding: torch.Tensor, mel_bins: int) -> PromptFeatures:
    return PromptFeatures(
        embedding=embedding.reshape(1, -1).float(),
        speech_tokens=torch.zeros(1, 0, dtype=torch.int32),
        speech_feat=torch.zeros(1, 0, mel_bins),
    )


def spk2info_features(entry: dict[str, Any], mel_bins: int) -> PromptFeatures:
    """A ``spk2info.pt`` entry: an SFT speaker (``embedding`` only) or a zero-shot speaker saved by the
    reference's ``add_zero_shot_spk`` (prompt text ids, prompt tokens, prompt mel, embeddings)."""
    if "flow_prompt_speech_token" in entry:
        text_ids = entry.get("prompt_text")
        return PromptFeatures(
            embedding=entry["flow_embedding"].reshape(1, -1).float().cpu(),
            speech_tokens=entry["flow_prompt_speech_token"].reshape(1, -1).to(torch.int32).cpu(),
            speech_feat=entry["prompt_speech_feat"].reshape(1, -1, mel_bins).float().cpu(),
            prompt_text_ids=None if text_ids is None else text_ids.reshape(1, -1).to(torch.int32).cpu(),
        )
    if "embedding" in entry:
        return _empty_features(entry["embedding"].cpu(), mel_bins)
    raise ValueError(f"unrecognised spk2info entry with keys {sorted(entry)}")


GPU_TOKEN2WAV_BATCH = 8
"""Token-to-wave chunks per call on a GPU unless set (``RTVOICE_COSYVOICE_TOKEN2WAV_BATCH``); 1 on a CPU."""


def default_token2wav_batch(device: torch.device) -> int:
    # On a CPU a padded flow batch costs about what its rows cost one by one (bench/cosyvoice2_scale.py),
    # and one long call delays every other stream's next step; on a GPU it is nearly free.
    return GPU_TOKEN2WAV_BATCH if device.type == "cuda" else 1


class CosyVoice2Service:
    def __init__(self, model: CosyVoice2Model, model_dir: Path, device: torch.device,
                 store: VoiceStore | None, threads: int = 1, token2wav_batch: int | None = None) -> None:
        self.model = model
        self.threads = max(1, threads)
        self.model_dir = model_dir
        self.device = device
        self.token2wav_batch = max(1, token2wav_batch or default_token2wav_batch(device))
        """Most token-to-wave chunks one call takes (the voices' ``max_batch('token2wav')``)."""
        self.estimator_backend = "torch"
        """What runs the flow estimator: 'torch', 'trt-fp16' or 'trt-fp32' (see ``trt.py``)."""
        self.model_key = f"{MODEL_NAME}:{model_dir.resolve()}"
        """Batch keys carry this, so steps of every voice of this model may share a call."""
        self.store = store
        vocab = model.llm.backbone.config.vocab_size
        self.frontend = Frontend(
            load_tokenizer(model_dir / QWEN_DIR, vocab), model.mel, model.sample_rate, model.config.token_mel_ratio,
            model.speech_tokenizer, model.campplus,
        )
        noise_frames = model.flow.decoder.rand_noise.shape[2]
        self.max_flow_tokens = noise_frames // model.config.token_mel_ratio - 1
        """Prompt plus speech tokens one flow call can take (its fixed noise is that long)."""
        self.mel_bins = model.config.flow.output_size
        self._warm = False
        self._warm_lock = threading.Lock()
        self.speakers: dict[str, CosyVoice2Voice] = {}
        for name, entry in sorted(model.spk2info.items()):
            try:
                features = spk2info_features(entry, self.mel_bins)
                voice_id = f"{MODEL_NAME}-{name}"
                self.speakers[voice_id] = self.make_voice(voice_id, features, name=name, source="spk2info",
                                                          description=f"CosyVoice2 speaker '{name}' (spk2info.pt)")
            except (ValueError, KeyError, RuntimeError) as error:
                log.warning("skipping spk2info speaker %r: %s", name, error)

    @classmethod
    def load(cls, model_dir: Path, voices_dir: Path | None, device: str = "cpu", threads: int = 1, *,
             estimator: str = "auto", token2wav_batch: int = 0, data_dir: Path | None = None,
             concurrent_calls: int = 1) -> CosyVoice2Service:
        """Load ``model_dir``; the keywords are the ``RTVOICE_COSYVOICE_*`` settings, passed by the registry.

        ``token2wav_batch`` 0 picks the device's default; ``data_dir`` is where TensorRT engines go when the
        model directory is read-only; ``concurrent_calls`` sizes the TensorRT context pool (runner threads).
        """
        model_dir = Path(model_dir)
        check_model_dir(model_dir)
        torch.set_num_threads(max(1, threads))
        resolved = resolve_device(device)
        log.info("loading CosyVoice2 from %s on %s", model_dir, resolved)
        model = CosyVoice2Model.load(model_dir, device=resolved)
        service = cls(model, model_dir, resolved, VoiceStore(voices_dir) if voices_dir is not None else None, threads,
                      token2wav_batch=token2wav_batch or None)
        service.setup_estimator(estimator, data_dir=data_dir, contexts=concurrent_calls)
        if not service.frontend.can_clone:
            log.warning("%s has no %s: zero-shot, cross-lingual, instruct2 and voice registration are off",
                        model_dir, " / ".join(n for n, s in (("speech_tokenizer_v2.onnx", model.speech_tokenizer),
                                                              ("campplus.onnx", model.campplus)) if s is None))
        return service

    def setup_estimator(self, backend: str, *, data_dir: Path | None = None, contexts: int = 2,
                        optimization_level: int | None = None) -> Any:
        """Run the flow estimator on ``backend`` ('torch', 'trt-fp16', 'trt-fp32', 'auto'); TensorRT falls
        back to torch (logged once) without CUDA or TensorRT. Returns the :class:`trt.Setup`."""
        from .trt import setup_estimator

        setup = setup_estimator(self.model.flow, backend, device=self.device, model_dir=self.model_dir,
                                data_dir=data_dir, contexts=contexts, max_batch=self.token2wav_batch,
                                optimization_level=optimization_level)
        self.estimator_backend = setup.backend
        return setup

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    # -- voices -----------------------------------------------------------------------------------

    def make_voice(self, voice_id: str, features: PromptFeatures, *, name: str | None = None, mode: Mode | None = None,
                   instructions: str | None = None, source: str = "", description: str = "",
                   language: str = LANGUAGE) -> CosyVoice2Voice:
        info = VoiceInfo(id=voice_id, name=name or voice_id, language=language, sample_rate=self.sample_rate,
                         model=MODEL_NAME, description=description)
        return CosyVoice2Voice(self, info, features.to(self.device), mode=mode, instructions=instructions,
                               source=source)

    def registered_voices(self) -> list[CosyVoice2Voice]:
        if self.store is None:
            return []
        voices = []
        for saved in self.store.load_all():
            try:
                voices.append(self.make_voice(saved.voice_id, saved.features, name=saved.name, source="registered",
                                              description=saved.description, language=saved.language))
            except ValueError as error:
                log.warning("skipping registered voice %r: %s", saved.voice_id, error)
        return voices

    def voices(self) -> list[CosyVoice2Voice]:
        """The spk2info speakers, then the registered voices."""
        return list(self.speakers.values()) + self.registered_voices()

    def prompt_audio(self, data: bytes, param: str = "prompt_wav") -> PromptAudio:
        """Decode and check an uploaded prompt (raises InvalidRequest). Blocking: call from a thread."""
        return load_prompt_audio(data, self.sample_rate, param)

    def prompt_features(self, audio: PromptAudio, prompt_text: str = "") -> PromptFeatures:
        """Speech tokens, prompt mel, embedding (and the transcript's ids). Blocking: call from a thread."""
        self._threads()
        return self.frontend.features(audio, prompt_text)

    def prompt_voice(self, features: PromptFeatures, mode: Mode, instructions: str | None = None) -> CosyVoice2Voice:
        """A one-off voice for a request that brings its own prompt (zero-shot, cross-lingual, instruct2)."""
        return self.make_voice(f"{MODEL_NAME}-{mode.replace('_', '-')}", features, mode=mode,
                               instructions=instructions, source="request",
                               description=f"CosyVoice2 {mode} voice from a request's prompt")

    def register(self, voice_id: str, features: PromptFeatures, *, name: str = "", language: str = LANGUAGE,
                 description: str = "") -> CosyVoice2Voice:
        """Save a zero-shot voice in the voices directory and return it (the caller adds it to the registry)."""
        if self.store is None:
            raise RuntimeError("no directory for registered voices")
        if features.prompt_text_ids is None:
            raise ValueError("a registered voice needs the transcript of its prompt")
        description = description or f"CosyVoice2 zero-shot voice '{voice_id}'"
        voice = self.make_voice(voice_id, features, name=name or voice_id, source="registered",
                                description=description, language=language)
        self.store.save(SavedVoice(voice_id, voice.info.name, language, description, features))
        return voice

    def unregister(self, voice_id: str) -> None:
        if self.store is not None:
            self.store.delete(voice_id)

    # -- batched steps ----------------------------------------------------------------------------

    def _threads(self) -> None:
        # torch keeps its intra-op thread count per OS thread (OpenMP); runner threads may predate the load.
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def run(self, kind: str, payloads: list[Any]) -> list[Any]:
        self._threads()
        if kind == "lm":
            return self._lm(payloads)
        if kind == "token2wav":
            return self._token2wav(payloads)
        raise ValueError(f"unknown step kind {kind!r}")

    def _lm(self, jobs: list[PrefillJob | DecodeJob]) -> list[LMResult]:
        llm = self.model.llm
        streams = []
        for job in jobs:
            if isinstance(job, PrefillJob):
                text_ids = ids_tensor(job.text_ids, self.device)
                stream = llm.start(text_ids, job.prompt.text_ids, job.prompt.speech_tokens,
                                   generator=job.generator, min_token_text_ratio=MIN_TOKEN_TEXT_RATIO,
                                   max_token_text_ratio=MAX_TOKEN_TEXT_RATIO)
                stream.max_len = min(stream.max_len, job.max_tokens)
                stream.min_len = min(stream.min_len, stream.max_len)
                stream.finished = stream.max_len <= 0
                streams.append(stream)
            else:
                streams.append(job.stream)
        live = [s for s in streams if not s.finished]
        tokens: dict[int, int | None] = {}
        if live:
            for stream, logp in zip(live, llm.forward_step(live), strict=True):
                tokens[id(stream)] = llm.choose(stream, logp)
        return [LMResult(stream, tokens.get(id(stream))) for stream in streams]

    def _token2wav(self, jobs: list[Token2WavJob]) -> list[np.ndarray]:
        chunks = self.model.token2wav.step_many([job.stream for job in jobs])
        return [speech.reshape(-1).float().cpu().numpy() for speech in chunks]

    # -- warmup -----------------------------------------------------------------------------------

    def warmup(self) -> None:
        """Every code path once (prefill, decode steps, a streaming chunk, a final chunk), once per model."""
        with self._warm_lock:
            if self._warm:
                return
            self._threads()
            llm, t2w = self.model.llm, self.model.token2wav
            generator = torch.Generator(device=self.device).manual_seed(0)
            empty = torch.zeros(1, 0, dtype=torch.int32, device=self.device)
            text = ids_tensor(self.frontend.text_ids("Warming up."), self.device)
            stream = llm.start(text, empty, empty, generator=generator)
            for _ in range(3):
                logp = llm.forward_step([stream])[0]
                llm.choose(stream, logp)
            prompt = next(iter(self.speakers.values())).flow_prompt if self.speakers else None
            if prompt is None:
                from .token2wav import FlowPrompt

                prompt = FlowPrompt(empty, torch.zeros(1, 0, self.mel_bins, device=self.device),
                                    torch.zeros(1, self.model.config.flow.spk_embed_dim, device=self.device))
            chunks = t2w.stream(prompt, generator)
            chunks.add_tokens([1] * (t2w.chunk_size * 2 + t2w.pre_lookahead))
            chunks.step()
            chunks.end()
            while chunks.ready():
                chunks.step()
            self._warm = True
