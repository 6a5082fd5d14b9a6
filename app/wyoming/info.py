"""``describe`` → ``info``: one TTS program, rtvoice, with every voice the engine has.

Home Assistant's Wyoming integration reads the program's name and its installed voices (each voice's ``name`` is
what a ``synthesize`` names, its ``languages`` what Home Assistant offers it for, its ``description`` what it shows)
and, from ``supports_synthesize_streaming``, whether it may stream an LLM's reply into the program as it is written.
The info is written in the event's data block, as every event is (``framing.EventWriter``), so its size never counts
against a client's header line limit.
"""

from __future__ import annotations

from wyoming.event import Event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from rtvoice.engine.models.base import VoiceInfo

PROGRAM = "rtvoice"
DESCRIPTION = "Real-time text-to-speech: audio streams while the text is still being written, below the sentence"

MODEL_ATTRIBUTIONS = {
    "piper": Attribution(name="rhasspy", url="https://github.com/rhasspy/piper"),
    "cosyvoice2": Attribution(name="FunAudioLLM", url="https://github.com/FunAudioLLM/CosyVoice"),
}
"""Who made each model's voices."""


def tts_voice(voice: VoiceInfo) -> TtsVoice:
    return TtsVoice(
        name=voice.id,
        attribution=MODEL_ATTRIBUTIONS.get(voice.model, Attribution(name=voice.model, url="")),
        installed=True,
        description=voice.description or voice.name,
        version=None,
        languages=[voice.language],
    )


def info_event(voices: list[VoiceInfo], default_voice: str, version: str, url: str) -> Event:
    """The ``info`` event: rtvoice (``version``, its page at ``url``) and its voices, the default voice first."""
    ordered = sorted(voices, key=lambda voice: voice.id != default_voice)
    program = TtsProgram(
        name=PROGRAM,
        attribution=Attribution(name=PROGRAM, url=url),
        installed=True,
        description=DESCRIPTION,
        version=version,
        voices=[tts_voice(voice) for voice in ordered],
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program]).event()
