"""The ``voice`` of a ``synthesize`` or ``synthesize-start``: which engine voice speaks.

- missing (or ``{}``): the default voice;
- ``{name, speaker?}``: the voice with that id (or alias: OpenAI's voice names, ``RTVOICE_OPENAI_VOICE_MAP``); an
  unknown name is an ``error`` event (``voice_not_found``). ``speaker`` is accepted and not used: every voice here
  has one speaker;
- ``{language}``: the default voice when it speaks that language, else the first voice that does (``en-US``,
  ``en_us`` and ``en_US`` are the same language, and ``en`` takes any English voice); none is an ``error``
  (``unsupported_language``).
"""

from __future__ import annotations

from typing import Any

from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import VoiceInfo

VOICE_PARAM = "voice.name"
LANGUAGE_PARAM = "voice.language"


def _language_key(language: str) -> str:
    return language.strip().replace("-", "_").lower()


def speaks(voice: VoiceInfo, language: str) -> bool:
    own, asked = _language_key(voice.language), _language_key(language)
    return own == asked or ("_" not in asked and own.split("_")[0] == asked)


def requested_voice(voice: Any, voices: list[VoiceInfo], default_voice: str) -> str | None:
    """The voice name to open a stream with (None: the default voice), from a request's ``voice`` field; checked by
    the engine when the stream opens. InvalidRequest for a field that is not a voice, or a language no voice
    speaks."""
    if voice is None:
        return None
    if not isinstance(voice, dict):
        raise InvalidRequest(
            "'voice' must be an object: {name, speaker?} or {language}", code="invalid_value", param="voice"
        )
    name = voice.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise InvalidRequest("'voice.name' must be a string", code="invalid_value", param=VOICE_PARAM)
        return name or None
    language = voice.get("language")
    if language is None:
        return None
    if not isinstance(language, str):
        raise InvalidRequest("'voice.language' must be a string", code="invalid_value", param=LANGUAGE_PARAM)
    matching = [info for info in voices if speaks(info, language)]
    if not matching:
        spoken = sorted({info.language for info in voices})
        raise InvalidRequest(
            f"no voice speaks {language!r}; languages: {', '.join(spoken)}",
            code="unsupported_language",
            param=LANGUAGE_PARAM,
        )
    return next((info.id for info in matching if info.id == default_voice), matching[0].id)
