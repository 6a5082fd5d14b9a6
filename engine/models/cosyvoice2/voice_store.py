"""Registered CosyVoice2 voices on disk: one ``<voice_id>.pt`` per voice in a directory of their own.

A file holds the prompt features (speech tokens, prompt mel, speaker embedding), the transcript and
its text ids, and the voice's name, language and description: a plain dict of tensors and strings,
written atomically with ``torch.save`` and read back with ``weights_only=True``. The directory is
never the model directory (which may be read-only and is shared between deployments).
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from rtvoice.engine.durable import remove_unfinished, write_atomically

from .frontend import PromptFeatures

log = logging.getLogger(__name__)

FORMAT = "rtvoice-cosyvoice2-voice"
VERSION = 1
VOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Ids are file names too: letters, digits, '_', '.', '-', at most 64, not starting with a symbol."""


def valid_voice_id(voice_id: str) -> bool:
    return bool(VOICE_ID.match(voice_id)) and not voice_id.endswith(".")


@dataclass(frozen=True)
class SavedVoice:
    voice_id: str
    name: str
    language: str
    description: str
    features: PromptFeatures


class VoiceStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, voice_id: str) -> Path:
        if not valid_voice_id(voice_id):
            raise ValueError(f"invalid voice id {voice_id!r}")
        return self.directory / f"{voice_id}.pt"

    def save(self, voice: SavedVoice) -> Path:
        features = voice.features
        record = {
            "format": FORMAT,
            "version": VERSION,
            "voice_id": voice.voice_id,
            "name": voice.name,
            "language": voice.language,
            "description": voice.description,
            "prompt_text": features.prompt_text,
            "prompt_text_ids": (
                features.prompt_text_ids
                if features.prompt_text_ids is not None
                else torch.zeros(1, 0, dtype=torch.int32)
            ).cpu(),
            "speech_tokens": features.speech_tokens.cpu(),
            "speech_feat": features.speech_feat.cpu(),
            "embedding": features.embedding.cpu(),
        }
        target = self.path(voice.voice_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        data = io.BytesIO()
        torch.save(record, data)  # in memory first, so a failing disk raises OSError (torch.save says RuntimeError)
        write_atomically(target, data.getbuffer())
        return target

    def load(self, path: Path) -> SavedVoice:
        record = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ValueError(f"{path} is not an rtvoice CosyVoice2 voice file")
        if record.get("version") != VERSION:
            raise ValueError(f"{path}: unsupported version {record.get('version')}")
        ids = record["prompt_text_ids"]
        features = PromptFeatures(
            embedding=record["embedding"],
            speech_tokens=record["speech_tokens"],
            speech_feat=record["speech_feat"],
            prompt_text=record["prompt_text"],
            prompt_text_ids=ids if ids.shape[1] > 0 else None,
        )
        return SavedVoice(record["voice_id"], record["name"], record["language"], record["description"], features)

    def load_all(self) -> list[SavedVoice]:
        if not self.directory.is_dir():
            return []
        remove_unfinished(self.directory, "voice")
        voices = []
        for path in sorted(self.directory.glob("*.pt")):
            try:
                saved = self.load(path)
                if saved.voice_id != path.stem:
                    raise ValueError(f"holds voice {saved.voice_id!r}, not {path.stem!r}")
                voices.append(saved)
            except Exception as error:  # one bad file must not stop the server, nor the other voices
                log.error(
                    "skipping the registered voice file %s: it cannot be read (%s); delete or replace it", path, error
                )
        return voices

    def exists(self, voice_id: str) -> bool:
        return self.path(voice_id).exists()

    def ids(self) -> set[str]:
        """The ids of the voice files in the directory now (other replicas sharing it add and delete them too)."""
        if not self.directory.is_dir():
            return set()
        return {path.stem for path in self.directory.glob("*.pt") if valid_voice_id(path.stem)}

    def delete(self, voice_id: str) -> None:
        self.path(voice_id).unlink(missing_ok=True)
