"""One request for speech, as every transport hands it to the engine.

A transport maps its protocol's fields onto a ``SynthesisRequest`` and calls ``Engine.open_stream`` with it; the
engine checks all of it there, once, for every transport. ``FieldNames`` carries the protocol's own names for the
fields, so that an error names what the client sent (``input``, ``tts_text``, ``voice.id``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.ssml import InlineTags, TextType

PromptMode = Literal["zero_shot", "cross_lingual", "instruct2"]

Recording: TypeAlias = "bytes | Callable[[], Awaitable[bytes]]"
"""A prompt recording (any audio file PyAV decodes), or how to read it: read only once the rest of its request has
been checked, so that a bad field is refused before an upload is read."""


async def read_recording(recording: Recording) -> bytes:
    return recording if isinstance(recording, bytes) else await recording()


@dataclass(frozen=True)
class FieldNames:
    """What the protocol calls each field of the request (the ``param`` of the errors about it)."""

    text: str = "text"
    voice: str = "voice"
    sample_rate: str = "sample_rate"
    speed: str = "speed"
    instructions: str = "instructions"
    prompt_text: str = "prompt_text"
    prompt_audio: str = "prompt_wav"
    text_type: str = "input_type"
    lexicons: str = "lexicons"


@dataclass(frozen=True)
class VoicePrompt:
    """A request that brings its own voice: a recording to speak like (CosyVoice2's zero-shot, cross-lingual and
    instruct2 modes)."""

    mode: PromptMode
    text: str = ""
    """What is said in the recording (zero-shot only)."""


@dataclass(frozen=True)
class SynthesisRequest:
    """What one engine stream is asked to speak, and how."""

    text: str | None = None
    """The whole text; None when the transport pushes it in pieces (``SpeechStream.push_text``)."""
    voice: str | None = None
    """A voice id or alias; the default voice when None or empty."""
    options: SynthesisOptions = field(default_factory=SynthesisOptions)
    sample_rate: int | None = None
    """The output rate; the voice's own when None."""
    unknown_voice_is_default: bool = False
    """A voice name that names no voice speaks with the default voice (Piper's server, Cartesia's voice ids)."""
    instructions_required: bool = False
    """The voice must follow ``options.instructions`` (CosyVoice's instruct request), else the request fails."""
    prompt: VoicePrompt | None = None
    """The request's own voice (``voice`` is then ignored); opened with ``Engine.open_prompt_stream``."""
    trim_leading_silence: bool = False
    """Drop the voice's silence before its first sound (a live player would only hear it as delay)."""
    normalize: bool = True
    """Read numbers, money, dates, times, units and abbreviations in their spoken form; False reads the text as sent
    (cleaned of control characters and extra blanks only)."""
    text_type: TextType = "auto"
    """``auto``: SSML when the text starts with ``<speak``, else plain text; ``ssml`` or ``text`` force it."""
    inline_tags: InlineTags = "break"
    """What plain text may hold: ``<break/>`` (ElevenLabs', Cartesia's) everywhere; ``cartesia`` adds Cartesia's
    ``<speed/>``, ``<volume/>``, ``<spell>`` and ``<emotion/>`` (its routes)."""
    lexicons: tuple[str, ...] = ()
    """Uploaded pronunciation lexicons (ids) to read the text with, before the server's own."""
    words: bool = False
    """The transport sends word timings and SSML marks (``WordTiming``, ``MarkTiming`` events); without it the
    stream has none, and its voice skips working them out before its first audio."""
    names: FieldNames = field(default_factory=FieldNames)
