"""Piper's HTTP API: ``POST /synthesize``, as ``piper.http_server`` (OHF-Voice/piper1-gpl) serves it.

The JSON body is Piper's: ``text``, ``voice``, ``speaker``/``speaker_id``, ``length_scale``, ``noise_scale``,
``noise_w_scale``. The answer is a WAV with a canonical 44-byte PCM header, streamed as it is made (the
header's sizes say "unknown", 0xFFFFFFFF, since the length is not known when it leaves), at the voice's own
rate, which clients read from the header (Pipecat's ``PiperHttpTTSService`` does).

As in Piper's server, a voice that is not there speaks with the default voice (``X-Voice`` names the voice
used), and a speaker is chosen only on multi-speaker voices. Where rtvoice differs:

- ``length_scale`` becomes the stream's speed, relative to the voice's own length scale;
- ``noise_scale`` and ``noise_w_scale`` are accepted and checked but not applied: rtvoice's voices take their
  noise scales from the voice's config (the engine's synthesis options have no noise knobs);
- ``speaker``/``speaker_id`` are accepted; rtvoice's Piper voices speak with their default speaker;
- a missing text is a 400 with rtvoice's error body (Piper's server fails with a 500);
- extension: ``seed`` (reproducible output).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rtvoice.app.fields import MAX_SPEED, MIN_SPEED
from rtvoice.app.json_body import parse_json_body
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body
from rtvoice.engine.audio.encoding import WavEncoder
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions, Voice

log = logging.getLogger(__name__)

router = APIRouter(tags=["Piper"])


class SynthesizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field("", description="The text to speak.")
    voice: str | None = Field(None, description="A voice id or alias; the default voice when omitted or unknown.")
    speaker: str | None = Field(None, description="Accepted; voices speak with their default speaker.")
    speaker_id: int | None = Field(None, ge=0, description="Accepted; voices speak with their default speaker.")
    length_scale: float | None = Field(None, gt=0, description="Phoneme length: above the voice's own is slower.")
    noise_scale: float | None = Field(None, ge=0, description="Accepted; the voice's own noise scale applies.")
    noise_w_scale: float | None = Field(None, ge=0, description="Accepted; the voice's own applies.")
    seed: int | None = Field(None, description="rtvoice extension: makes the voice's random draws reproducible.")


def voice_length_scale(voice: Voice) -> float:
    """The length scale a voice speaks with at speed 1 (a Piper voice's config; 1 for other models)."""
    config = getattr(voice, "config", None)
    return float(getattr(config, "length_scale", 1.0) or 1.0)


def speed_for(voice: Voice, length_scale: float | None) -> float:
    if length_scale is None:
        return 1.0
    speed = voice_length_scale(voice) / length_scale
    if not MIN_SPEED <= speed <= MAX_SPEED:
        low, high = voice_length_scale(voice) / MAX_SPEED, voice_length_scale(voice) / MIN_SPEED
        raise InvalidRequest(
            f"length_scale {length_scale} is outside what voice {voice.info.id!r} can do ({low:.3g} to {high:.3g})",
            code="invalid_value",
            param="length_scale",
        )
    return speed


@router.post(
    "/synthesize",
    response_class=StreamingResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": SynthesizeRequest.model_json_schema()}},
        }
    },
    responses={200: {"content": {"audio/wav": {}}}},
)
async def synthesize(request: Request) -> Response:
    """Speak ``text`` as a streaming WAV (Piper's HTTP API)."""
    piper = await parse_json_body(request, SynthesizeRequest)
    engine = engine_of(request)
    text = piper.text.strip()
    engine.check_text(text, "text")
    if piper.voice and piper.voice not in engine.voices:
        log.warning("voice %r not found; using the default voice (as Piper's server does)", piper.voice)
    voice = engine.resolve_voice(piper.voice if piper.voice in engine.voices else None)
    options = SynthesisOptions(speed=speed_for(voice, piper.length_scale), seed=piper.seed)
    rate = voice.info.sample_rate
    stream = engine.open_stream(voice, options, rate, text=text)
    return SpeechResponse(
        audio_body(stream, WavEncoder(rate)),
        media_type="audio/wav",
        headers={"X-Sample-Rate": str(rate), "X-Voice": voice.info.id},
    )
