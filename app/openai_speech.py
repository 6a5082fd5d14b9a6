"""OpenAI's speech API: ``POST /v1/audio/speech`` and a voice list."""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rtvoice.app.fields import InputType, Lexicons, Normalize, Speed
from rtvoice.app.json_body import parse_json_body
from rtvoice.app.openapi import schema_ref
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body, sse_body, stream_headers
from rtvoice.app.voice_fields import voice_fields
from rtvoice.engine.audio.encoding import FORMATS, create_encoder
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import FieldNames, SynthesisRequest
from rtvoice.engine.stream import SpeechStream

router = APIRouter(tags=["OpenAI"])

OPENAI_SAMPLE_RATE = 24_000
"""OpenAI's API speaks at 24 kHz in every format; ``pcm`` is 24 kHz s16le."""


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="Accepted for compatibility; the voice decides the model.")
    input: str = Field(description="The text to speak.")
    voice: str = Field(description="A voice id from /v1/audio/voices, or an OpenAI voice name (alloy, echo, ...).")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Speed = 1.0
    instructions: str | None = Field(None, description="Accepted; the embedded voice ignores it.")
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, description="rtvoice extension: makes the voice's random draws reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: Lexicons = Field(default_factory=list)

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_object(cls, value: Any) -> Any:
        # Newer clients may send a custom voice as {"id": "..."}.
        if isinstance(value, dict) and "id" in value:
            return value["id"]
        return value


def _usage(text: str) -> Any:
    def usage(stream: SpeechStream) -> dict[str, int]:
        # No tokenizer sits in front of the voice: count ~4 characters a text
        # token and 20 ms of audio an audio token.
        input_tokens = math.ceil(len(text) / 4)
        output_tokens = math.ceil(stream.emitted_s * 50)
        return {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }

    return usage


@router.post(
    "/v1/audio/speech",
    response_class=StreamingResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema_ref(SpeechRequest, "OpenAISpeechRequest")}},
        }
    },
    responses={200: {"content": {fmt.content_type: {} for fmt in FORMATS.values()}}},
)
async def create_speech(request: Request) -> Response:
    """Speak ``input``; the audio streams as it is made (``stream_format=sse`` for JSON events)."""
    speech = await parse_json_body(request, SpeechRequest)
    options = SynthesisOptions(speed=speech.speed, seed=speech.seed, instructions=speech.instructions)
    stream = engine_of(request).open_stream(
        SynthesisRequest(
            text=speech.input,
            voice=speech.voice,
            options=options,
            sample_rate=OPENAI_SAMPLE_RATE,
            normalize=speech.normalize,
            text_type=speech.input_type,
            lexicons=tuple(speech.lexicons),
            names=FieldNames(text="input"),
            words=speech.stream_format == "sse",  # only the SSE events carry words
        )
    )
    encoder = create_encoder(speech.response_format, OPENAI_SAMPLE_RATE)
    # X-Request-ID, which OpenAI's clients surface (LiveKit's plugin warns without it), comes from
    # app/request_context.py, on every response.
    if speech.stream_format == "sse":
        return SpeechResponse(
            sse_body(stream, encoder, _usage(speech.input)),
            media_type="text/event-stream",
            headers={**stream_headers(stream), "Cache-Control": "no-cache"},
        )
    return SpeechResponse(audio_body(stream, encoder), media_type=encoder.content_type, headers=stream_headers(stream))


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> JSONResponse:
    """Voices by id, and the OpenAI names that map onto them."""
    engine = engine_of(request)
    return JSONResponse(
        {
            "voices": [voice_fields(info) for info in engine.voice_infos()],
            "aliases": engine.voice_aliases(),
        }
    )
