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

import asyncio
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from rtvoice.app.errors import HttpError, invalid_value
from rtvoice.app.fields import Speed
from rtvoice.app.state import engine_of
from rtvoice.app.streaming import SpeechResponse, audio_body
from rtvoice.engine.audio.encoding import FORMATS, create_encoder
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import InvalidRequest, ModelNotLoaded
from rtvoice.engine.models.base import SynthesisOptions, Voice, VoiceInfo
from rtvoice.engine.models.cosyvoice2 import info as cosyvoice2

router = APIRouter(tags=["CosyVoice"])


class SftForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tts_text: str = Field(description="The text to speak.")
    spk_id: str | None = Field(None, description="A voice id from /voices; the default voice when omitted.")
    format: Literal["wav", "pcm"] = Field("wav", description="wav: streaming WAV; pcm: raw int16 samples.")
    sample_rate: int | None = Field(None, description="Output rate; the voice's own rate when omitted.")
    speed: Speed = Field(1.0, description="Speaking rate: 2.0 is twice as fast.")
    seed: int | None = Field(None, description="Makes the voice's random draws reproducible.")


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
    schema = form.model_json_schema()
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
    schema = form.model_json_schema()
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


_AUDIO_RESPONSES = {200: {"content": {FORMATS["wav"].content_type: {}, FORMATS["pcm"].content_type: {}}}}


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
    engine = engine_of(request)
    engine.check_text(form.tts_text, "tts_text")
    voice = resolve_speaker(engine, form.spk_id)
    engine.check_sample_rate(form.sample_rate)
    rate = form.sample_rate or voice.info.sample_rate
    stream = engine.open_stream(voice, SynthesisOptions(speed=form.speed, seed=form.seed), rate, text=form.tts_text)
    encoder = create_encoder(form.format, rate)
    return SpeechResponse(
        audio_body(stream, encoder),
        media_type=encoder.content_type,
        headers={"X-Sample-Rate": str(rate), "X-Voice": voice.info.id},
    )


def resolve_speaker(engine: Engine, spk_id: str | None, param: str = "spk_id") -> Voice:
    """A voice by id or alias; a name CosyVoice's clients know from ``spk2info.pt`` (``中文女``) finds the voice
    rtvoice serves it as (``cosyvoice2-中文女``)."""
    if spk_id and spk_id not in engine.voices and f"{cosyvoice2.SPEAKER_PREFIX}{spk_id}" in engine.voices:
        spk_id = f"{cosyvoice2.SPEAKER_PREFIX}{spk_id}"
    return engine.resolve_voice(spk_id, param=param)


def takes_instructions(info: VoiceInfo) -> bool:
    """True for voices that follow an instruction (CosyVoice2's instruct2); Piper voices ignore instructions."""
    return info.model == cosyvoice2.MODEL_NAME


# -- CosyVoice2 with a prompt recording -------------------------------------------------------------


class PromptForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tts_text: str = Field(description="The text to speak.")
    format: Literal["wav", "pcm"] = Field("wav", description="wav: streaming WAV; pcm: raw int16 samples.")
    sample_rate: int | None = Field(None, description="Output rate; 24000 (the model's own) when omitted.")
    speed: float = Field(
        cosyvoice2.STREAMING_SPEED, description=f"CosyVoice2 streams at {cosyvoice2.STREAMING_SPEED} only."
    )
    seed: int | None = Field(None, description="Makes sampling and the vocoder's noise reproducible.")


class ZeroShotForm(PromptForm):
    prompt_text: str = Field(description="What is said in prompt_wav.")


class CrossLingualForm(PromptForm):
    pass


class Instruct2Form(PromptForm):
    instruct_text: str = Field(description="How to speak (e.g. 'Speak cheerfully.'); '<|endofprompt|>' is appended.")


def _prompt_doc(form: type[BaseModel], *, get: bool) -> dict[str, Any]:
    """A route with the prompt recording: its body is multipart, since it carries the upload."""
    return _form_doc(form, get=get, files=("prompt_wav",), content_types=("multipart/form-data",))


def cloning_service(engine: Engine) -> Any:
    service = engine.cosyvoice
    if not service.frontend.can_clone:
        raise ModelNotLoaded(
            f"the CosyVoice2 directory {service.model_dir} lacks speech_tokenizer_v2.onnx or campplus.onnx: "
            "prompt recordings cannot be used",
            code="frontend_not_loaded",
        )
    return service


async def _upload(files: dict[str, UploadFile], name: str = "prompt_wav") -> bytes:
    upload = files.get(name)
    if upload is None:
        raise InvalidRequest(
            f"'{name}' is required: upload the prompt recording as a file", code="missing_file", param=name
        )
    from rtvoice.engine.models.cosyvoice2.frontend import MAX_UPLOAD_BYTES

    return await upload.read(MAX_UPLOAD_BYTES + 1)  # one byte over the limit is enough to refuse it


async def _prompt_route(request: Request, model: type[PromptForm], mode: str) -> Response:
    form, files = await parse_form(request, model)
    engine = engine_of(request)
    cloning_service(engine)  # 503 before anything is read when this server cannot use recordings
    engine.check_text(form.tts_text, "tts_text")
    instructions = None
    if isinstance(form, ZeroShotForm):
        engine.check_text(form.prompt_text, "prompt_text")
    if isinstance(form, Instruct2Form):
        engine.check_text(form.instruct_text, "instruct_text")
        instructions = form.instruct_text
    engine.check_sample_rate(form.sample_rate)
    engine.check_options(cosyvoice2.validate, SynthesisOptions(speed=form.speed))
    data = await _upload(files)
    prompt_text = form.prompt_text if isinstance(form, ZeroShotForm) else ""
    voice = await prompt_voice(engine, data, mode, prompt_text, instructions)
    return _stream_response(engine, voice, form)


async def prompt_voice(
    engine: Engine,
    data: bytes,
    mode: str,
    prompt_text: str = "",
    instructions: str | None = None,
    param: str = "prompt_wav",
) -> Voice:
    """A one-off CosyVoice2 voice from a prompt recording (any audio file PyAV decodes): its features are
    extracted off the event loop (decoding, the speech tokenizer and CAM++ take tens to hundreds of ms)."""
    service = cloning_service(engine)

    def features() -> Any:
        return service.prompt_features(service.prompt_audio(data, param), prompt_text)

    prompt = await asyncio.get_running_loop().run_in_executor(None, features)
    return service.prompt_voice(prompt, mode, instructions)


def _stream_response(engine: Engine, voice: Voice, form: PromptForm) -> Response:
    rate = form.sample_rate or voice.info.sample_rate
    stream = engine.open_stream(voice, SynthesisOptions(seed=form.seed), rate, text=form.tts_text)
    encoder = create_encoder(form.format, rate)
    return SpeechResponse(
        audio_body(stream, encoder),
        media_type=encoder.content_type,
        headers={"X-Sample-Rate": str(rate), "X-Voice": voice.info.id},
    )


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


def _voice_json(voice: Voice) -> dict[str, Any]:
    body: dict[str, Any] = dict(voice.info.__dict__)
    features = getattr(voice, "features", None)
    if getattr(voice, "source", "") == "registered" and features is not None:
        body["prompt_text"] = features.prompt_text
    return body


def _check_voice_id_free(engine: Engine, voice_id: str) -> None:
    """409 when ``voice_id`` names a voice: checked before the recording is read, and again after each wait,
    since another request may register the same id meanwhile."""
    if voice_id in engine.voices:
        raise HttpError(f"voice {voice_id!r} exists", code="voice_exists", param="voice_id", status=409)


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
    service = cloning_service(engine)
    from rtvoice.engine.models.cosyvoice2.voice_store import valid_voice_id  # torch: only with a model loaded

    if not valid_voice_id(form.voice_id):
        raise InvalidRequest(
            "'voice_id' may hold letters, digits, '_', '.' and '-' (at most 64, starting with a letter or digit)",
            code="invalid_voice_id",
            param="voice_id",
        )
    _check_voice_id_free(engine, form.voice_id)
    engine.check_text(form.prompt_text, "prompt_text")
    data = await _upload(files)
    loop = asyncio.get_running_loop()
    prompt = await loop.run_in_executor(
        None, lambda: service.prompt_features(service.prompt_audio(data), form.prompt_text)
    )
    _check_voice_id_free(engine, form.voice_id)  # registered by another request meanwhile?
    try:
        voice = await loop.run_in_executor(
            None,
            lambda: service.register(
                form.voice_id, prompt, name=form.name or "", language=form.language, description=form.description
            ),
        )
    except OSError as error:
        raise HttpError(
            f"could not save the voice: {error}", code="voice_not_saved", status=500, type="server_error"
        ) from error
    _check_voice_id_free(engine, form.voice_id)
    engine.voices.add(voice)
    return JSONResponse(_voice_json(voice), status_code=201, headers={"Location": f"/v1/voices/{voice.info.id}"})


@router.get("/v1/voices", tags=["Voices"])
async def list_voices(request: Request) -> JSONResponse:
    """Every voice (as /voices)."""
    engine = engine_of(request)
    return JSONResponse({"voices": [_voice_json(engine.voices.resolve(voice_id)) for voice_id in engine.voices.ids()]})


def voice_of(request: Request, voice_id: str) -> Voice:
    """The voice named in the path (a dependency); 404 when there is none."""
    voice = engine_of(request).voices.get(voice_id)
    if voice is None:
        raise HttpError(f"no voice {voice_id!r}", code="voice_not_found", param="voice_id", status=404)
    return voice


PathVoice = Annotated[Voice, Depends(voice_of)]


@router.get("/v1/voices/{voice_id}", tags=["Voices"])
async def get_voice(voice: PathVoice) -> JSONResponse:
    return JSONResponse(_voice_json(voice))


@router.delete("/v1/voices/{voice_id}", status_code=204, tags=["Voices"])
async def delete_voice(request: Request, voice_id: str, voice: PathVoice) -> Response:
    """Delete a registered voice (streams already speaking with it finish)."""
    engine = engine_of(request)
    service = engine.cosyvoice
    if getattr(voice, "source", "") != "registered":
        raise HttpError(
            f"voice {voice_id!r} is not a registered voice and cannot be deleted",
            code="voice_not_deletable",
            param="voice_id",
            status=409,
        )
    try:
        engine.voices.remove(voice_id)
    except ValueError as error:
        raise HttpError(
            f"{error}; change the server's settings first", code="voice_in_use", param="voice_id", status=409
        ) from error
    await asyncio.get_running_loop().run_in_executor(None, service.unregister, voice_id)
    return Response(status_code=204)
