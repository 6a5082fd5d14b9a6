"""CosyVoice's FastAPI form API: ``/inference_sft`` (GET and POST, form fields or query parameters).

CosyVoice's own server streams headerless int16 PCM; here the default is a
streaming WAV (header first, sizes 'unknown') and ``format=pcm`` gives the raw
samples its clients expect. The sample rate is also in ``X-Sample-Rate``.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import error_response, validation_error_response
from app.state import engine_of
from app.streaming import audio_body
from engine.audio.encoding import FORMATS, create_encoder
from engine.models.base import SynthesisOptions

router = APIRouter(tags=["CosyVoice"])


class SftForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tts_text: str = Field(description="The text to speak.")
    spk_id: str | None = Field(None, description="A voice id from /voices; the default voice when omitted.")
    format: Literal["wav", "pcm"] = Field("wav", description="wav: streaming WAV; pcm: raw int16 samples.")
    sample_rate: int | None = Field(None, description="Output rate; the voice's own rate when omitted.")
    speed: float = Field(1.0, ge=0.25, le=4.0)
    seed: int | None = Field(None, description="Makes the voice's random draws reproducible.")


async def read_fields(request: Request) -> dict[str, str]:
    """Query parameters and form fields together (CosyVoice's client sends a form even with GET)."""
    fields: dict[str, str] = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form()
        fields.update({key: value for key, value in form.items() if isinstance(value, str)})
    return fields


_SFT_DOC = {"requestBody": {"content": {
    "application/x-www-form-urlencoded": {"schema": SftForm.model_json_schema()},
    "multipart/form-data": {"schema": SftForm.model_json_schema()},
}}}


_AUDIO_RESPONSES = {200: {"content": {FORMATS["wav"].content_type: {}, FORMATS["pcm"].content_type: {}}}}


@router.get("/inference_sft", response_class=StreamingResponse, operation_id="inference_sft_get",
            openapi_extra=_SFT_DOC, responses=_AUDIO_RESPONSES)
@router.post("/inference_sft", response_class=StreamingResponse, operation_id="inference_sft",
             openapi_extra=_SFT_DOC, responses=_AUDIO_RESPONSES)
async def inference_sft(request: Request) -> Response:
    """Speak ``tts_text`` with voice ``spk_id``, streaming as it is made."""
    try:
        fields = await read_fields(request)
    except Exception as error:  # python-multipart's errors for a broken body
        return error_response(400, f"malformed form body: {error}", code="invalid_form")
    try:
        form = SftForm.model_validate(fields)
    except ValidationError as error:
        return validation_error_response(error)
    engine = engine_of(request)
    engine.check_text(form.tts_text, "tts_text")
    voice = engine.resolve_voice(form.spk_id, param="spk_id")
    engine.check_sample_rate(form.sample_rate)
    rate = form.sample_rate or voice.info.sample_rate
    stream = engine.open_stream(voice, SynthesisOptions(speed=form.speed, seed=form.seed), rate, text=form.tts_text)
    encoder = create_encoder(form.format, rate)
    return StreamingResponse(audio_body(stream, encoder), media_type=encoder.content_type,
                             headers={"X-Sample-Rate": str(rate), "X-Voice": voice.info.id})
