"""Cartesia's requests: the JSON models both transports parse, and their mapping onto the engine.

``api_key``/``X-API-Key`` and ``cartesia_version``/``Cartesia-Version`` are accepted and not checked (rtvoice has no
API keys); ``model_id``, ``language`` and the voice controls other than ``generation_config.speed`` are accepted and
ignored. Extensions: ``seed`` (reproducible output), ``normalize`` (false: the text is read as sent), ``input_type``
(SSML or plain text, forced) and ``lexicons`` (uploaded pronunciation lexicons); on the WebSocket, a context's first
request fixes them. A Cartesia voice id (a UUID) that names no rtvoice voice speaks with the default voice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rtvoice.app.fields import InputType, Lexicons, Normalize, Speed
from rtvoice.engine.audio.encoding import Encoder, PcmEncoder, PcmF32Encoder, WavEncoder, create_encoder
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import FieldNames, SynthesisRequest

RAW_ENCODERS: dict[str, type[PcmEncoder] | type[PcmF32Encoder]] = {"pcm_s16le": PcmEncoder, "pcm_f32le": PcmF32Encoder}
CARTESIA_VOICE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
"""Cartesia's voice ids are UUIDs."""


class VoiceSpecifier(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: Literal["id", "embedding"] = "id"
    id: str | None = Field(
        None,
        description="An rtvoice voice id or alias; a Cartesia voice id (a UUID) that "
        "names no rtvoice voice speaks with the default voice.",
    )


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    container: Literal["raw", "wav", "mp3"] = "raw"
    encoding: str = "pcm_s16le"
    sample_rate: int | None = Field(None, description="The voice's own rate when omitted.")


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speed: Speed | None = None


class SpeechRequest(BaseModel):
    """The fields /tts/bytes and a WebSocket generation request share."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model_id: str | None = Field(None, description="Accepted; the voice decides the model.")
    transcript: str = ""
    voice: VoiceSpecifier = Field(default_factory=VoiceSpecifier)
    output_format: OutputFormat = Field(default_factory=OutputFormat)
    language: str | None = Field(None, description="Accepted; the voice decides the language.")
    generation_config: GenerationConfig = Field(default_factory=GenerationConfig)
    seed: int | None = Field(None, description="rtvoice extension: makes the voice's random draws reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: Lexicons = Field(default_factory=list)


class GenerationRequest(SpeechRequest):
    context_id: str | None = None
    continue_: bool = Field(False, alias="continue")
    flush: bool = False
    add_timestamps: bool = False
    max_buffer_delay_ms: int | None = Field(None, ge=0, le=5000)


NAMES = FieldNames(
    text="transcript", voice="voice.id", sample_rate="output_format.sample_rate", speed="generation_config.speed"
)
"""Cartesia's names for the request's fields."""


def synthesis_request(request: SpeechRequest, text: str | None, words: bool = False) -> SynthesisRequest:
    """The engine request of a Cartesia request (``words``: its timestamps are sent). Cartesia's own voice ids
    (UUIDs), which no rtvoice voice has, speak with the default voice, so a client switched from Cartesia keeps
    working; any other unknown name is an error."""
    if request.voice.mode != "id":
        raise InvalidRequest(
            "voice embeddings are not supported; give a voice by id (voice.mode 'id')",
            code="unsupported_voice_mode",
            param="voice.mode",
        )
    voice = request.voice.id
    return SynthesisRequest(
        text=text,
        voice=voice,
        options=SynthesisOptions(speed=request.generation_config.speed or 1.0, seed=request.seed),
        sample_rate=request.output_format.sample_rate,
        unknown_voice_is_default=bool(voice and CARTESIA_VOICE_ID.match(voice)),
        normalize=request.normalize,
        text_type=request.input_type,
        lexicons=tuple(request.lexicons),
        inline_tags="cartesia",  # Pipecat's Cartesia service puts Cartesia's tags into plain transcripts
        names=NAMES,
        words=words,
    )


def cartesia_encoder(fmt: OutputFormat, containers: Sequence[str]) -> Callable[[int], Encoder]:
    """How to encode ``fmt`` at a rate, once the format is known to be served (InvalidRequest otherwise)."""
    if fmt.container not in containers:
        raise InvalidRequest(
            f"container {fmt.container!r} is not served here; use {', '.join(containers)}",
            code="unsupported_format",
            param="output_format.container",
        )
    if fmt.container == "mp3":
        return lambda sample_rate: create_encoder("mp3", sample_rate)
    encodings = ["pcm_s16le"] if fmt.container == "wav" else list(RAW_ENCODERS)
    if fmt.encoding not in encodings:
        raise InvalidRequest(
            f"encoding {fmt.encoding!r} is not served in a {fmt.container} container; use {', '.join(encodings)}",
            code="unsupported_encoding",
            param="output_format.encoding",
        )
    if fmt.container == "wav":
        return WavEncoder
    raw = RAW_ENCODERS[fmt.encoding]
    return lambda sample_rate: raw()
