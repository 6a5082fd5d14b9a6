"""A voice as the JSON every voice list and voice resource returns (``/voices``, ``/v1/audio/voices``,
``/v1/voices``)."""

from __future__ import annotations

from typing import Any

from rtvoice.engine.models.base import VoiceInfo


def voice_fields(info: VoiceInfo) -> dict[str, Any]:
    """Id (usable as ``voice`` or ``spk_id``), name, language, sample rate, model, description; a registered
    voice's ``prompt_text`` too."""
    fields: dict[str, Any] = {
        "id": info.id,
        "name": info.name,
        "language": info.language,
        "sample_rate": info.sample_rate,
        "model": info.model,
        "description": info.description,
    }
    if info.source == "registered" and info.prompt_text is not None:
        fields["prompt_text"] = info.prompt_text
    return fields
