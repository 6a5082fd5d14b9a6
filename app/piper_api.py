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
- extensions: ``seed`` (reproducible output), ``normalize`` (false: the text is read as sent), ``input_type``
  (SSML or plain text, forced) and ``lexicons`` (uploaded pronunciation lexicons).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rtvoice.app.fields import MAX_SPEED, MIN_SPEED, InputType, Lexicons, Normalize
from rtvoice.app.json_body import parse_json_body
from rtvoice.app.openapi import schema_ref
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body, stream_headers
from rtvoice.engine.audio.encoding import WavEncoder
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions, VoiceInfo
from rtvoice.engine.request import SynthesisRequest

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
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: Lexicons = Field(default_factory=list)


def speed_for(voice: VoiceInfo, length_scale: float | None) -> float:
    """The speed at which ``voice`` speaks with Piper's ``length_scale``; InvalidRequest outside the speeds every
    voice takes, said in length scales."""
    if length_scale is None:
        return 1.0
    speed = voice.speed_for_length_scale(length_scale)
    if not MIN_SPEED <= speed <= MAX_SPEED:
        own = voice.length_scale or 1.0
        low, high = own / MAX_SPEED, own / MIN_SPEED
        raise InvalidRequest(
            f"length_scale {length_scale} is outside what voice {voice.id!r} can do ({low:.3g} to {high:.3g})",
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
            "content": {"application/json": {"schema": schema_ref(SynthesizeRequest)}},
        }
    },
    responses={200: {"content": {"audio/wav": {}}}},
)
async def synthesize(request: Request) -> Response:
    """Speak ``text`` as a streaming WAV (Piper's HTTP API)."""
    piper = await parse_json_body(request, SynthesizeRequest)
    engine = engine_of(request)
    # As in Piper's server, a voice that is not there speaks with the default voice.
    voice = engine.voice_info(piper.voice, unknown_is_default=True)
    options = SynthesisOptions(speed=speed_for(voice, piper.length_scale), seed=piper.seed)
    stream = engine.open_stream(
        SynthesisRequest(
            text=piper.text.strip(),
            voice=voice.id,
            options=options,
            normalize=piper.normalize,
            text_type=piper.input_type,
            lexicons=tuple(piper.lexicons),
        )
    )
    return SpeechResponse(
        audio_body(stream, WavEncoder(stream.sample_rate)), media_type="audio/wav", headers=stream_headers(stream)
    )
