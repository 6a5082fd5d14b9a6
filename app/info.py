"""``GET /v1/info``: what this server offers, for a page or a client to set itself up before it speaks (limits,
bounds, formats, rates, models and whether they clone, whether keys are required). Open, like ``/healthz``: it
names no voice, only models."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from rtvoice.app.access import KeyRing
from rtvoice.app.fields import MAX_SPEED, MIN_SPEED
from rtvoice.app.settings import Settings
from rtvoice.app.state import engine_of
from rtvoice.engine.audio.encoding import FORMATS
from rtvoice.engine.audio.resample import SUPPORTED_SAMPLE_RATES

router = APIRouter(tags=["Operations"])

SPEECH_PATH = "/v1/audio/speech"
"""The route whose key requirement ``keys_required`` reports (every speech route shares it)."""


def package_version() -> str:
    try:
        return version("rtvoice")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class SpeedBounds(BaseModel):
    min: float = Field(description="The slowest `speed` a request may ask for.")
    max: float = Field(description="The fastest `speed` a request may ask for.")
    default: float = 1.0


class ModelInfo(BaseModel):
    model: str = Field(description="The model family, as in a voice's `model` field.")
    voices: int = Field(description="How many voices speak with it.")
    can_clone: bool = Field(description="Whether it makes voices from a prompt recording (`POST /v1/voices`).")
    follows_instructions: bool = Field(description="Whether `instructions` change how it speaks.")
    cross_lingual: bool = Field(description="Whether its voices speak text of any language.")


class ServerInfo(BaseModel):
    version: str
    max_text_chars: int = Field(description="The most characters one request's text may have.")
    speed: SpeedBounds
    formats: list[str] = Field(description="`response_format` values of `POST /v1/audio/speech`.")
    sample_rates: list[int] = Field(description="Rates a request may ask for (`sample_rate`).")
    default_voice: str
    models: list[ModelInfo]
    cloning: bool = Field(description="Whether a loaded model can clone a voice from a recording.")
    keys_required: bool = Field(description="Whether speech routes need an API key.")
    max_recording_bytes: int = Field(description="The largest prompt recording a cloning request may bring.")


@router.get("/v1/info", response_model=ServerInfo)
async def info(request: Request) -> ServerInfo:
    """What this server offers: limits, speed bounds, formats, sample rates, models, cloning, keys. Open (no
    key); 503 while the voices load."""
    engine = engine_of(request)
    settings: Settings = request.app.state.settings
    models: dict[str, ModelInfo] = {}
    for voice in engine.voice_infos():
        entry = models.setdefault(
            voice.model,
            ModelInfo(model=voice.model, voices=0, can_clone=False, follows_instructions=False, cross_lingual=False),
        )
        entry.voices += 1
        entry.can_clone = entry.can_clone or voice.can_clone
        entry.follows_instructions = entry.follows_instructions or voice.follows_instructions
        entry.cross_lingual = entry.cross_lingual or voice.cross_lingual
    return ServerInfo(
        version=package_version(),
        max_text_chars=settings.max_text_chars,
        speed=SpeedBounds(min=MIN_SPEED, max=MAX_SPEED),
        formats=list(FORMATS),
        sample_rates=list(SUPPORTED_SAMPLE_RATES),
        default_voice=engine.default_voice_id,
        models=list(models.values()),
        cloning=any(model.can_clone for model in models.values()),
        keys_required=KeyRing.from_settings(settings).required(SPEECH_PATH, "POST"),
        max_recording_bytes=engine.max_recording_bytes,
    )
