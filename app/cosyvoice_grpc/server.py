"""CosyVoice's gRPC service served by rtvoice: ``Inference(Request) returns (stream Response)``.

A ``grpc.aio`` server in the web server's event loop, on its own port, turning each request into one engine
stream, as the HTTP routes do, so it shares the one scheduler with every other transport:

- ``sft_request``: any voice by id (``spk_id``: Piper, a CosyVoice2 ``spk2info`` speaker by its id or its bare
  name, a registered voice; the default voice when empty);
- ``zero_shot_request``, ``cross_lingual_request``: CosyVoice2 with the request's prompt, raw int16 PCM at
  16 kHz as CosyVoice's client sends it;
- ``instruct_request``: a voice by id that takes instructions (CosyVoice2), speaking as ``instruct_text`` says.

The proto has no field for rtvoice's text options, so they come as call metadata: ``x-input-type`` (``auto``,
``ssml``, ``text``) and ``x-lexicons`` (uploaded lexicons' ids, comma-separated); what the text's markup asked for
that was not done comes back in the trailing metadata ``x-ssml-ignored``.

Answers stream as raw int16 little-endian mono PCM at the voice's own rate (22.05 kHz for the embedded Piper
voice, 24 kHz for CosyVoice2), one ``Response`` per chunk. Errors end the call with a status:
INVALID_ARGUMENT (bad text, prompt or instruction), NOT_FOUND (no such voice), RESOURCE_EXHAUSTED (over
capacity, or over the API key's quota), UNAUTHENTICATED (a missing or wrong key), FAILED_PRECONDITION (no
CosyVoice2 model, or no prompt front end, on this server), UNAVAILABLE (still loading), INTERNAL (synthesis
failed). A client that cancels or disconnects frees its stream at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtvoice.app.access import Access
from rtvoice.app.cosyvoice_grpc import cosyvoice_pb2, cosyvoice_pb2_grpc
from rtvoice.app.cosyvoice_grpc.guard import Guard
from rtvoice.app.cosyvoice_grpc.status import status_of
from rtvoice.app.drain import Drain
from rtvoice.app.errors import invalid_value
from rtvoice.app.fields import InputType, LexiconList
from rtvoice.app.metrics import RequestMetrics
from rtvoice.app.request_context import track_stream
from rtvoice.app.state import still_loading
from rtvoice.app.streaming import IGNORED_HEADER, ignored_value
from rtvoice.engine.audio.encoding import wav_header
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import FieldNames, SynthesisRequest, VoicePrompt
from rtvoice.engine.stream import SpeechStream

log = logging.getLogger(__name__)

METHOD = "/cosyvoice.CosyVoice/Inference"
PROMPT_RATE = 16_000
"""CosyVoice's clients send prompt audio as raw int16 PCM at 16 kHz."""


def prompt_wav(pcm: bytes, param: str = "prompt_audio") -> bytes:
    """Raw 16 kHz int16 prompt samples as a WAV file, so they take the same decoding and checks as an upload."""
    if len(pcm) % 2:
        raise InvalidRequest(
            f"'{param}' must be int16 samples (an even number of bytes); it has {len(pcm)}",
            code="invalid_audio",
            param=param,
        )
    return wav_header(PROMPT_RATE, len(pcm)) + pcm


class TextOptions(BaseModel):
    """rtvoice's text options, from the call's metadata (the proto has no field for them)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    input_type: InputType = Field("auto", alias="x-input-type")
    lexicons: LexiconList = Field(default_factory=list, alias="x-lexicons")

    @classmethod
    def of(cls, context: grpc.aio.ServicerContext) -> TextOptions:
        metadata = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        try:
            return cls.model_validate(metadata)
        except ValidationError as error:
            raise invalid_value(error) from error


class CosyVoiceService(cosyvoice_pb2_grpc.CosyVoiceServicer):
    def __init__(self, engine: Engine, requests: RequestMetrics) -> None:
        self.engine = engine
        self.requests = requests

    async def Inference(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        try:
            stream = await self._open(request, TextOptions.of(context))
            track_stream(stream)
        except EngineError as error:
            await self._abort(context, error)
            return
        try:
            async for pcm in stream.audio():
                audio = pcm.astype("<i2", copy=False).tobytes()
                # protobuf's builder makes the message classes at import; the generated module has no .pyi.
                yield cosyvoice_pb2.Response(tts_audio=audio)  # type: ignore[attr-defined]
        except EngineError as error:  # the stream failed
            await self._abort(context, error)
        finally:
            stream.cancel()  # the client cancelled or left: free the stream's slot now
        ignored = ignored_value(stream, "ascii")
        if ignored is not None:
            context.set_trailing_metadata(((IGNORED_HEADER.lower(), ignored),))
        self.requests.count("grpc", METHOD, grpc.StatusCode.OK.name)

    async def _abort(self, context: grpc.aio.ServicerContext, error: EngineError) -> None:
        status = status_of(error)
        self.requests.count("grpc", METHOD, status.name)
        metadata: tuple[tuple[str, str], ...] = (("rtvoice-error-code", error.code),)
        if error.retry_after_s is not None:
            metadata += (("retry-after", str(error.retry_after_s)),)
        await context.abort(status, error.message, trailing_metadata=metadata)

    async def _open(self, request: Any, options: TextOptions) -> SpeechStream:
        """The request's payload as one engine stream."""
        engine = self.engine
        if not engine.ready:
            raise still_loading()
        payload = request.WhichOneof("RequestPayload")
        base = SynthesisRequest(text_type=options.input_type, lexicons=tuple(options.lexicons), names=NAMES)
        if payload == "sft_request":
            sft = request.sft_request
            return engine.open_stream(replace(base, text=sft.tts_text, voice=sft.spk_id or None))
        if payload == "zero_shot_request":
            zero_shot = request.zero_shot_request
            speech = replace(base, text=zero_shot.tts_text, prompt=VoicePrompt("zero_shot", text=zero_shot.prompt_text))
            return await engine.open_prompt_stream(speech, recording(zero_shot.prompt_audio))
        if payload == "cross_lingual_request":
            cross_lingual = request.cross_lingual_request
            speech = replace(base, text=cross_lingual.tts_text, prompt=VoicePrompt("cross_lingual"))
            return await engine.open_prompt_stream(speech, recording(cross_lingual.prompt_audio))
        if payload == "instruct_request":
            instruct = request.instruct_request
            return engine.open_stream(
                replace(
                    base,
                    text=instruct.tts_text,
                    voice=instruct.spk_id or None,
                    options=SynthesisOptions(instructions=instruct.instruct_text),
                    instructions_required=True,
                )
            )
        raise InvalidRequest(
            "the request has no payload: set one of sft_request, zero_shot_request, "
            "cross_lingual_request, instruct_request",
            code="missing_payload",
            param="RequestPayload",
        )


NAMES = FieldNames(
    text="tts_text",
    voice="spk_id",
    instructions="instruct_text",
    prompt_audio="prompt_audio",
    text_type="x-input-type",
    lexicons="x-lexicons",
)
"""The proto's names for the request's fields, and the metadata keys of rtvoice's text options."""


def recording(pcm: bytes) -> Callable[[], Awaitable[bytes]]:
    """A request's raw prompt samples as a recording, read (and checked) once the rest of the request is."""

    async def read() -> bytes:
        return prompt_wav(pcm)

    return read


async def start(
    engine: Engine,
    host: str,
    port: int,
    requests: RequestMetrics,
    access: Access | None = None,
    drain: Drain | None = None,
) -> grpc.aio.Server:
    """Start the service on ``host:port`` in the running event loop; the caller stops it."""
    interceptors = [Guard(access, drain, requests)] if access is not None and drain is not None else []
    server = grpc.aio.server(interceptors=interceptors)
    cosyvoice_pb2_grpc.add_CosyVoiceServicer_to_server(CosyVoiceService(engine, requests), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:
        raise RuntimeError(f"cannot serve CosyVoice's gRPC service on {address}: {error}") from error
    await server.start()
    log.info("CosyVoice gRPC service on %s", address)
    return server
