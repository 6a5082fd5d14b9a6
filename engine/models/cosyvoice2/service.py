"""One loaded CosyVoice2 model and everything that speaks with it.

:class:`CosyVoice2Service` owns the weights (:class:`~engine.models.cosyvoice2.model.CosyVoice2Model`),
the front end, the saved speakers (``spk2info.pt``) and the registered voices (a directory of
``*.pt`` files outside the model directory); it makes :class:`CosyVoice2Voice` objects for each of
them and for one-off prompts, and runs the batched steps of all of them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from rtvoice.engine.models.base import VoiceInfo

from .files import CosyVoiceDirError, check_model_dir
from .frontend import Frontend, PromptAudio, PromptFeatures, load_prompt_audio
from .info import MODEL_NAME, SPEAKER_PREFIX
from .model import CosyVoice2Model
from .runner import CosyVoice2Runner
from .voice import CosyVoice2Voice, Mode
from .voice_store import SavedVoice, VoiceStore

log = logging.getLogger(__name__)

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


class CosyVoice2Service:
    def __init__(
        self,
        model: CosyVoice2Model,
        model_dir: Path,
        device: torch.device,
        store: VoiceStore | None,
        threads: int = 1,
        token2wav_batch: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.runner = CosyVoice2Runner(model, model_dir, device, threads, token2wav_batch, cuda_graphs)
        """Runs the steps of every voice of this model."""
        self.model_dir = model_dir
        self.store = store
        self.speakers: dict[str, CosyVoice2Voice] = {}
        for name, entry in sorted(model.spk2info.items()):
            try:
                features = spk2info_features(entry, self.mel_bins)
                voice_id = f"{SPEAKER_PREFIX}{name}"
                self.speakers[voice_id] = self.make_voice(
                    voice_id,
                    features,
                    name=name,
                    source="spk2info",
                    description=f"CosyVoice2 speaker '{name}' (spk2info.pt)",
                )
            except (ValueError, KeyError, RuntimeError) as error:
                log.warning("skipping spk2info speaker %r: %s", name, error)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        voices_dir: Path | None,
        device: str = "cpu",
        threads: int = 1,
        *,
        estimator: str = "auto",
        token2wav_batch: int = 0,
        data_dir: Path | None = None,
        concurrent_calls: int = 1,
        cuda_graphs: bool = True,
    ) -> CosyVoice2Service:
        """Load ``model_dir``; the keywords are the ``RTVOICE_COSYVOICE_*`` settings, passed by the registry.

        ``token2wav_batch`` 0 picks the device's default; ``data_dir`` is where TensorRT engines go when the
        model directory is read-only; ``concurrent_calls`` sizes the TensorRT context pool (runner threads);
        ``cuda_graphs`` captures the LM's decode step as CUDA graphs (CUDA only).
        """
        model_dir = Path(model_dir)
        check_model_dir(model_dir)
        torch.set_num_threads(max(1, threads))
        resolved = resolve_device(device)
        log.info("loading CosyVoice2 from %s on %s", model_dir, resolved)
        model = CosyVoice2Model.load(model_dir, device=resolved)
        service = cls(
            model,
            model_dir,
            resolved,
            VoiceStore(voices_dir) if voices_dir is not None else None,
            threads,
            token2wav_batch=token2wav_batch or None,
            cuda_graphs=cuda_graphs,
        )
        service.setup_estimator(estimator, data_dir=data_dir, contexts=concurrent_calls)
        if not service.frontend.can_clone:
            log.warning(
                "%s has no %s: zero-shot, cross-lingual, instruct2 and voice registration are off",
                model_dir,
                " / ".join(
                    n
                    for n, s in (
                        ("speech_tokenizer_v2.onnx", model.speech_tokenizer),
                        ("campplus.onnx", model.campplus),
                    )
                    if s is None
                ),
            )
        return service

    def setup_estimator(
        self, backend: str, *, data_dir: Path | None = None, contexts: int = 2, optimization_level: int | None = None
    ) -> Any:
        """Run the flow estimator on ``backend`` ('torch', 'trt-fp16', 'trt-fp32', 'auto'); TensorRT falls
        back to torch (logged once) without CUDA or TensorRT. Returns the :class:`trt.Setup`."""
        from .trt import setup_estimator

        setup = setup_estimator(
            self.model.flow,
            backend,
            device=self.device,
            model_dir=self.model_dir,
            data_dir=data_dir,
            contexts=contexts,
            max_batch=self.token2wav_batch,
            optimization_level=optimization_level,
        )
        return setup

    @property
    def model(self) -> CosyVoice2Model:
        return self.runner.model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def frontend(self) -> Frontend:
        return self.runner.frontend

    @property
    def mel_bins(self) -> int:
        return self.runner.mel_bins

    @property
    def token2wav_batch(self) -> int:
        return self.runner.token2wav_batch

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    # -- voices -----------------------------------------------------------------------------------

    def make_voice(
        self,
        voice_id: str,
        features: PromptFeatures,
        *,
        name: str | None = None,
        mode: Mode | None = None,
        instructions: str | None = None,
        source: str = "",
        description: str = "",
        language: str = LANGUAGE,
    ) -> CosyVoice2Voice:
        info = VoiceInfo(
            id=voice_id,
            name=name or voice_id,
            language=language,
            sample_rate=self.sample_rate,
            model=MODEL_NAME,
            description=description,
            source=source or "builtin",
            prompt_text=features.prompt_text if source == "registered" else None,
            follows_instructions=True,
            cross_lingual=True,
            can_clone=self.frontend.can_clone,
            varies_rate=False,
        )
        return CosyVoice2Voice(
            self.runner, info, features.to(self.device), mode=mode, instructions=instructions, source=source
        )

    def registered_voices(self) -> list[CosyVoice2Voice]:
        if self.store is None:
            return []
        voices = []
        for saved in self.store.load_all():
            try:
                voices.append(self._registered(saved))
            except ValueError as error:
                log.warning("skipping registered voice %r: %s", saved.voice_id, error)
        return voices

    def _registered(self, saved: SavedVoice) -> CosyVoice2Voice:
        """The voice a stored registration describes."""
        return self.make_voice(
            saved.voice_id,
            saved.features,
            name=saved.name,
            source="registered",
            description=saved.description,
            language=saved.language,
        )

    def stored_voice(self, voice_id: str) -> CosyVoice2Voice | None:
        """A registered voice read from the voices directory now (another replica sharing the directory may have
        registered it); None when it is not there or cannot be read. Blocking: a small file."""
        if self.store is None:
            return None
        try:
            saved = self.store.load(self.store.path(voice_id))
            if saved.voice_id != voice_id:
                raise ValueError(f"holds voice {saved.voice_id!r}")
            return self._registered(saved)
        except FileNotFoundError:
            return None
        except Exception as error:  # a file being replaced, or a bad one: the voice stays unknown here
            log.warning("cannot read the registered voice %r from %s: %s", voice_id, self.store.directory, error)
            return None

    def voices(self) -> list[CosyVoice2Voice]:
        """The spk2info speakers, then the registered voices."""
        return list(self.speakers.values()) + self.registered_voices()

    def prompt_audio(self, data: bytes, param: str = "prompt_wav") -> PromptAudio:
        """Decode and check an uploaded prompt (raises InvalidRequest). Blocking: call from a thread."""
        return load_prompt_audio(data, self.sample_rate, param)

    def prompt_features(self, audio: PromptAudio, prompt_text: str = "") -> PromptFeatures:
        """Speech tokens, prompt mel, embedding (and the transcript's ids). Blocking: call from a thread."""
        self.runner.use_threads()
        return self.frontend.features(audio, prompt_text)

    def prompt_voice(self, features: PromptFeatures, mode: Mode, instructions: str | None = None) -> CosyVoice2Voice:
        """A one-off voice for a request that brings its own prompt (zero-shot, cross-lingual, instruct2)."""
        return self.make_voice(
            f"{MODEL_NAME}-{mode.replace('_', '-')}",
            features,
            mode=mode,
            instructions=instructions,
            source="request",
            description=f"CosyVoice2 {mode} voice from a request's prompt",
        )

    def register(
        self,
        voice_id: str,
        features: PromptFeatures,
        *,
        name: str = "",
        language: str = LANGUAGE,
        description: str = "",
    ) -> CosyVoice2Voice:
        """Save a zero-shot voice in the voices directory and return it (the caller adds it to the registry)."""
        if self.store is None:
            raise RuntimeError("no directory for registered voices")
        if features.prompt_text_ids is None:
            raise ValueError("a registered voice needs the transcript of its prompt")
        description = description or f"CosyVoice2 zero-shot voice '{voice_id}'"
        voice = self.make_voice(
            voice_id, features, name=name or voice_id, source="registered", description=description, language=language
        )
        self.store.save(SavedVoice(voice_id, voice.info.name, language, description, features))
        return voice

    def unregister(self, voice_id: str) -> None:
        if self.store is not None:
            self.store.delete(voice_id)

    def warmup(self) -> None:
        """Every code path of the model once (``CosyVoice2Runner.warmup``), with the first speaker's prompt."""
        speaker = next(iter(self.speakers.values()), None)
        self.runner.warmup(None if speaker is None else speaker.flow_prompt)
