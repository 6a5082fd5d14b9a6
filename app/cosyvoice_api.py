"""CosyVoice's FastAPI form API (GET and POST, form fields or query parameters), and voice registration.

- ``/inference_sft``: any voice by id (Piper, a CosyVoice2 ``spk2info`` speaker, a registered voice);
- ``/inference_zero_shot``, ``/inference_cross_lingual``, ``/inference_instruct2``: CosyVoice2 with
  the prompt recording (``prompt_wav``, an uploaded file) of the request, fields as in CosyVoice's
  own FastAPI server;
- ``POST /v1/voices`` registers a zero-shot voice (kept on disk, usable by id on every route),
  ``GET``/``DELETE /v1/voices/{id}``.

CosyVoice's own server streams headerless int16 PCM; here the default is a
streaming WAV (header first, sizes 'unknown') and ``format=pcm`` gives the raw
samples its clients expect. The sample rate is also in ``X-Sample-Rate``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from rtvoice.app.errors import HttpError, invalid_value
from rtvoice.app.fields import InputType, LexiconList, Normalize, Speed
from rtvoice.app.openapi import model_schema
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body, stream_headers
from rtvoice.app.voice_fields import voice_fields
from rtvoice.engine.audio.encoding import FORMATS, create_encoder
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions, VoiceInfo
from rtvoice.engine.request import FieldNames, PromptMode, SynthesisRequest, VoicePrompt
from rtvoice.engine.stream import SpeechStream

router = APIRouter(tags=["CosyVoice"])


class SftForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tts_text: str = Field(description="The text to speak.")
    spk_id: str | None = Field(None, description="A voice id from /voices; the default voice when omitted.")
    format: Literal["wav", "pcm"] = Field("wav", description="wav: streaming WAV; pcm: raw int16 samples.")
    sample_rate: int | None = Field(None, description="Output rate; the voice's own rate when omitted.")
    speed: Speed = Field(1.0, description="Speaking rate: 2.0 is twice as fast.")
    seed: int | None = Field(None, description="Makes the voice's random draws reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: LexiconList = Field(default_factory=list)


async def read_form(request: Request) -> tuple[dict[str, str], dict[str, UploadFile]]:
    """Query parameters and form fields together (CosyVoice's client sends a form even with GET), and uploaded files."""
    fields: dict[str, str] = dict(request.query_params)
    files: dict[str, UploadFile] = {}
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        parts = request.app.state.settings.max_form_parts
        form = await request.form(max_files=parts, max_fields=parts)
        for key, value in form.items():
            if isinstance(value, str):
                fields[key] = value
            else:
                files[key] = value
    return fields, files


Form = TypeVar("Form", bound=BaseModel)


async def parse_form(request: Request, model: type[Form]) -> tuple[Form, dict[str, UploadFile]]:
    """The fields (query and form) as ``model``, and the uploaded files; InvalidRequest (400) for a broken body or
    fields that do not validate."""
    try:
        fields, files = await read_form(request)
    except Exception as error:  # python-multipart's errors for a broken body
        raise InvalidRequest(f"malformed form body: {error}", code="invalid_form") from error
    try:
        return model.model_validate(fields), files
    except ValidationError as error:
        raise invalid_value(error) from error


# -- OpenAPI: POST takes a form body; GET takes query parameters, and also the form body that CosyVoice's own
# client sends with GET (read_form reads both; a field in both places takes the body's value).

_PROMPT_WAV = {
    "type": "string",
    "format": "binary",
    "description": "The voice to copy: any audio file PyAV decodes, 0.5 to 30 s, at least 16 kHz.",
}
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
_GET_BODY = (
    "CosyVoice's client sends the fields as a form body even with GET: accepted too. A field sent in "
    "both places takes the body's value."
)


def _query_parameters(form: type[BaseModel]) -> list[dict[str, Any]]:
    """The form's fields as query parameters. None is required there: each may come in the body instead."""
    schema = model_schema(form)
    required = set(schema.get("required", []))
    parameters = []
    for name, property_schema in schema["properties"].items():
        value_schema = {key: value for key, value in property_schema.items() if key != "description"}
        description = property_schema.get("description", "")
        if name in required:
            description = f"{description} Required, here or as a form field in the body.".strip()
        parameters.append(
            {"name": name, "in": "query", "required": False, "schema": value_schema, "description": description}
        )
    return parameters


def _form_schema(form: type[BaseModel], files: tuple[str, ...], *, fields_required: bool) -> dict[str, Any]:
    schema = model_schema(form)
    required = [*schema.get("required", [])] if fields_required else []
    return {
        **schema,
        "properties": {**schema.get("properties", {}), **{name: _PROMPT_WAV for name in files}},
        "required": [*required, *files],
    }


def _form_doc(
    form: type[BaseModel], *, get: bool, files: tuple[str, ...] = (), content_types: tuple[str, ...] = _FORM_TYPES
) -> dict[str, Any]:
    """``openapi_extra`` for a form route: POST's form body, or GET's query parameters and optional form body.

    With ``files`` (uploads, which only a multipart body carries) the body is required on GET too.
    """
    schema = _form_schema(form, files, fields_required=not get)
    body: dict[str, Any] = {
        "required": bool(files) or not get,
        "content": {content_type: {"schema": schema} for content_type in content_types},
    }
    if not get:
        return {"requestBody": body}
    return {"parameters": _query_parameters(form), "requestBody": {**body, "description": _GET_BODY}}


_AUDIO_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {FORMATS["wav"].content_type: {}, FORMATS["pcm"].content_type: {}}}
}


@router.get(
    "/inference_sft",
    response_class=StreamingResponse,
    operation_id="inference_sft_get",
    openapi_extra=_form_doc(SftForm, get=True),
    responses=_AUDIO_RESPONSES,
)
@router.post(
    "/inference_sft",
    response_class=StreamingResponse,
    operation_id="inference_sft",
    openapi_extra=_form_doc(SftForm, get=False),
    responses=_AUDIO_RESPONSES,
)
async def inference_sft(request: Request) -> Response:
    """Speak ``tts_text`` with voice ``spk_id``, streaming as it is made."""
    form, _ = await parse_form(request, SftForm)
    stream = engine_of(request).open_stream(
        SynthesisRequest(
            text=form.tts_text,
            voice=form.spk_id,
            options=SynthesisOptions(speed=form.speed, seed=form.seed),
            sample_rate=form.sample_rate,
            normalize=form.normalize,
            text_type=form.input_type,
            lexicons=tuple(form.lexicons),
            names=SFT_NAMES,
        )
    )
    return _audio_response(stream, form.format)


SFT_NAMES = FieldNames(text="tts_text", voice="spk_id")
"""CosyVoice's names for the fields (its HTTP and gRPC APIs share them)."""


def _audio_response(stream: SpeechStream, fmt: str) -> Response:
    encoder = create_encoder(fmt, stream.sample_rate)
    return SpeechResponse(audio_body(stream, encoder), media_type=encoder.content_type, headers=stream_headers(stream))


# -- CosyVoice2 with a prompt recording -------------------------------------------------------------


class PromptForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tts_text: str = Field(description="The text to speak.")
    format: Literal["wav", "pcm"] = Field("wav", description="wav: streaming WAV; pcm: raw int16 samples.")
    sample_rate: int | None = Field(None, description="Output rate; 24000 (the model's own) when omitted.")
    speed: float = Field(1.0, description="CosyVoice2 streams at 1.0 only.")
    seed: int | None = Field(None, description="Makes sampling and the vocoder's noise reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: LexiconList = Field(default_factory=list)


class ZeroShotForm(PromptForm):
    prompt_text: str = Field(description="What is said in prompt_wav.")


class CrossLingualForm(PromptForm):
    pass


class Instruct2Form(PromptForm):
    instruct_text: str = Field(description="How to speak (e.g. 'Speak cheerfully.'); '<|endofprompt|>' is appended.")


def _prompt_doc(form: type[BaseModel], *, get: bool) -> dict[str, Any]:
    """A route with the prompt recording: its body is multipart, since it carries the upload."""
    return _form_doc(form, get=get, files=("prompt_wav",), content_types=("multipart/form-data",))


async def read_upload(files: dict[str, UploadFile], limit: int, name: str = "prompt_wav") -> bytes:
    """An uploaded file's bytes, one over ``limit`` at most (enough to refuse it); InvalidRequest when missing."""
    upload = files.get(name)
    if upload is None:
        raise InvalidRequest(
            f"'{name}' is required: upload the prompt recording as a file", code="missing_file", param=name
        )
    return await upload.read(limit + 1)


async def _prompt_route(request: Request, model: type[PromptForm], mode: PromptMode) -> Response:
    form, files = await parse_form(request, model)
    engine = engine_of(request)
    instructions = form.instruct_text if isinstance(form, Instruct2Form) else None
    speech = SynthesisRequest(
        text=form.tts_text,
        options=SynthesisOptions(speed=form.speed, seed=form.seed, instructions=instructions),
        sample_rate=form.sample_rate,
        prompt=VoicePrompt(mode, text=form.prompt_text if isinstance(form, ZeroShotForm) else ""),
        normalize=form.normalize,
        text_type=form.input_type,
        lexicons=tuple(form.lexicons),
        names=PROMPT_NAMES,
    )
    stream = await engine.open_prompt_stream(speech, lambda: read_upload(files, engine.max_recording_bytes))
    return _audio_response(stream, form.format)


PROMPT_NAMES = FieldNames(text="tts_text", instructions="instruct_text", prompt_audio="prompt_wav")


@router.get(
    "/inference_zero_shot",
    response_class=StreamingResponse,
    operation_id="inference_zero_shot_get",
    openapi_extra=_prompt_doc(ZeroShotForm, get=True),
    responses=_AUDIO_RESPONSES,
)
@router.post(
    "/inference_zero_shot",
    response_class=StreamingResponse,
    operation_id="inference_zero_shot",
    openapi_extra=_prompt_doc(ZeroShotForm, get=False),
    responses=_AUDIO_RESPONSES,
)
async def inference_zero_shot(request: Request) -> Response:
    """CosyVoice2 zero-shot: speak ``tts_text`` in the voice of ``prompt_wav``, whose words are ``prompt_text``."""
    return await _prompt_route(request, ZeroShotForm, "zero_shot")


@router.get(
    "/inference_cross_lingual",
    response_class=StreamingResponse,
    operation_id="inference_cross_lingual_get",
    openapi_extra=_prompt_doc(CrossLingualForm, get=True),
    responses=_AUDIO_RESPONSES,
)
@router.post(
    "/inference_cross_lingual",
    response_class=StreamingResponse,
    operation_id="inference_cross_lingual",
    openapi_extra=_prompt_doc(CrossLingualForm, get=False),
    responses=_AUDIO_RESPONSES,
)
async def inference_cross_lingual(request: Request) -> Response:
    """CosyVoice2 cross-lingual: the voice of ``prompt_wav`` (no transcript; any language) speaks ``tts_text``."""
    return await _prompt_route(request, CrossLingualForm, "cross_lingual")


@router.get(
    "/inference_instruct2",
    response_class=StreamingResponse,
    operation_id="inference_instruct2_get",
    openapi_extra=_prompt_doc(Instruct2Form, get=True),
    responses=_AUDIO_RESPONSES,
)
@router.post(
    "/inference_instruct2",
    response_class=StreamingResponse,
    operation_id="inference_instruct2",
    openapi_extra=_prompt_doc(Instruct2Form, get=False),
    responses=_AUDIO_RESPONSES,
)
async def inference_instruct2(request: Request) -> Response:
    """CosyVoice2 instruct2: the voice of ``prompt_wav`` speaks ``tts_text`` as ``instruct_text`` says."""
    return await _prompt_route(request, Instruct2Form, "instruct2")


# -- registered voices ------------------------------------------------------------------------------


class RegisterForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    voice_id: str = Field(description="The new voice's id: letters, digits, '_', '.', '-' (at most 64).")
    prompt_text: str = Field(description="What is said in prompt_wav.")
    name: str | None = Field(None, description="A display name; the id when omitted.")
    language: str = Field("mul", description="ISO 639 code of the voice's usual language; 'mul' for several.")
    description: str = ""


@router.post(
    "/v1/voices",
    status_code=201,
    tags=["Voices"],
    openapi_extra=_prompt_doc(RegisterForm, get=False),
    responses={201: {"description": "The new voice."}, 409: {"description": "The id is taken."}},
)
async def register_voice(request: Request) -> Response:
    """Register a CosyVoice2 zero-shot voice from a recording and its transcript; kept across restarts."""
    form, files = await parse_form(request, RegisterForm)
    engine = engine_of(request)
    info = await engine.register_voice(
        form.voice_id,
        lambda: read_upload(files, engine.max_recording_bytes),
        form.prompt_text,
        name=form.name or "",
        language=form.language,
        description=form.description,
    )
    return JSONResponse(voice_fields(info), status_code=201, headers={"Location": f"/v1/voices/{info.id}"})


@router.get("/v1/voices", tags=["Voices"])
async def list_voices(request: Request) -> JSONResponse:
    """Every voice (as /voices)."""
    return JSONResponse({"voices": [voice_fields(info) for info in engine_of(request).voice_infos()]})


def voice_of(request: Request, voice_id: str) -> VoiceInfo:
    """The voice named in the path (a dependency); 404 when there is none."""
    info = engine_of(request).find_voice(voice_id)
    if info is None:
        raise HttpError(f"no voice {voice_id!r}", code="voice_not_found", param="voice_id", status=404)
    return info


PathVoice = Annotated[VoiceInfo, Depends(voice_of)]


@router.get("/v1/voices/{voice_id}", tags=["Voices"])
async def get_voice(voice: PathVoice) -> JSONResponse:
    return JSONResponse(voice_fields(voice))


@router.delete("/v1/voices/{voice_id}", status_code=204, tags=["Voices"])
async def delete_voice(request: Request, voice: PathVoice) -> Response:
    """Delete a registered voice (streams already speaking with it finish)."""
    await engine_of(request).delete_voice(voice.id)
    return Response(status_code=204)
