"""Cartesia's ``POST /tts/bytes``: one ``transcript`` spoken in ``output_format`` (raw, wav or mp3), streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from rtvoice.app.cartesia.requests import SpeechRequest, cartesia_encoder, synthesis_request
from rtvoice.app.json_body import parse_json_body
from rtvoice.app.openapi import schema_ref
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body, stream_headers

router = APIRouter(tags=["Cartesia"])

BYTES_PATH = "/tts/bytes"


@router.post(
    BYTES_PATH,
    response_class=StreamingResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema_ref(SpeechRequest, "CartesiaSpeechRequest")}},
        }
    },
    responses={200: {"content": {"audio/pcm": {}, "audio/wav": {}, "audio/mpeg": {}}}},
)
async def tts_bytes(request: Request) -> Response:
    """Cartesia's bytes endpoint: ``transcript`` spoken in ``output_format`` (raw, wav or mp3), streamed."""
    speech = await parse_json_body(request, SpeechRequest)
    encoder = cartesia_encoder(speech.output_format, ("raw", "wav", "mp3"))
    stream = engine_of(request).open_stream(synthesis_request(speech, speech.transcript))
    encoded = encoder(stream.sample_rate)
    return SpeechResponse(audio_body(stream, encoded), media_type=encoded.content_type, headers=stream_headers(stream))
