"""Voices made from a recording: a request's one-off voice, and voices registered to keep (CosyVoice2).

Decoding a recording and extracting its features (speech tokenizer, CAM++) take tens to hundreds of milliseconds,
so they run off the event loop; between those waits another request may take the same voice id, so it is checked
again after each.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from rtvoice.engine.errors import Conflict, InvalidRequest, ModelNotLoaded, StorageFailed
from rtvoice.engine.models.base import Voice, VoiceInfo
from rtvoice.engine.request import PromptMode
from rtvoice.engine.voices import VoiceRegistry

if TYPE_CHECKING:
    from rtvoice.engine.models.cosyvoice2.frontend import PromptFeatures
    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service

VOICE_ID_RULE = "letters, digits, '_', '.' and '-' (at most 64, starting with a letter or digit)"


def cosyvoice(voices: VoiceRegistry) -> CosyVoice2Service:
    """The loaded CosyVoice2 model; ModelNotLoaded when the server runs without one."""
    if voices.cosyvoice is None:
        raise ModelNotLoaded(
            "no CosyVoice2 model is loaded on this server; start it with RTVOICE_COSYVOICE_DIR set to a "
            "CosyVoice2 model directory",
            code="model_not_loaded",
        )
    return voices.cosyvoice


def cloning_service(voices: VoiceRegistry) -> CosyVoice2Service:
    """The CosyVoice2 model when it can make voices from recordings; ModelNotLoaded otherwise."""
    service = cosyvoice(voices)
    if not service.frontend.can_clone:
        raise ModelNotLoaded(
            f"the CosyVoice2 directory {service.model_dir} lacks speech_tokenizer_v2.onnx or campplus.onnx: "
            "prompt recordings cannot be used",
            code="frontend_not_loaded",
        )
    return service


async def features_of(service: CosyVoice2Service, audio: bytes, prompt_text: str, param: str) -> PromptFeatures:
    """A recording's features, extracted off the event loop (InvalidRequest naming ``param`` for bad audio)."""
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: service.prompt_features(service.prompt_audio(audio, param), prompt_text)
    )


async def prompt_voice(
    voices: VoiceRegistry, audio: bytes, mode: PromptMode, prompt_text: str, instructions: str | None, param: str
) -> Voice:
    """The one-off voice of a request's own recording."""
    service = cloning_service(voices)
    return service.prompt_voice(await features_of(service, audio, prompt_text, param), mode, instructions)


def sync_voice(voices: VoiceRegistry, voice_id: str) -> None:
    """Bring ``voice_id`` in line with the registered voices' directory, which replicas behind a balancer share: a
    voice another replica registered is read the first time it is named here, and a registered voice whose file
    another replica deleted is dropped. Costs one ``stat`` for a registered voice, nothing for any other."""
    service = voices.cosyvoice
    if service is None or service.store is None or not voice_id:
        return
    from rtvoice.engine.models.cosyvoice2.voice_store import valid_voice_id  # torch: only with a model loaded

    voice = voices.get(voice_id)
    if voice is not None:
        if voice.info.source == "registered" and not service.store.exists(voice_id):
            with contextlib.suppress(ValueError, KeyError):  # the default voice or an alias target stays
                voices.remove(voice_id)
        return
    if voice_id in voices or not valid_voice_id(voice_id) or not service.store.exists(voice_id):
        return
    stored = service.stored_voice(voice_id)
    if stored is not None and voice_id not in voices:
        voices.add(stored)


def sync_registered(voices: VoiceRegistry) -> None:
    """Every registered voice in line with the shared directory (for the voice list)."""
    service = voices.cosyvoice
    if service is None or service.store is None:
        return
    on_disk = service.store.ids()
    held = {voice.info.id for voice in voices.all() if voice.info.source == "registered"}
    for voice_id in (held - on_disk) | (on_disk - set(voices.ids())):
        sync_voice(voices, voice_id)


def check_voice_id(voices: VoiceRegistry, voice_id: str) -> None:
    """InvalidRequest for an id a voice may not have, Conflict when a voice has it (here or in the shared store)."""
    from rtvoice.engine.models.cosyvoice2.voice_store import valid_voice_id  # torch: only with a model loaded

    if not valid_voice_id(voice_id):
        raise InvalidRequest(f"'voice_id' may hold {VOICE_ID_RULE}", code="invalid_voice_id", param="voice_id")
    sync_voice(voices, voice_id)
    _check_free(voices, voice_id)


def _check_free(voices: VoiceRegistry, voice_id: str) -> None:
    if voice_id in voices:
        raise Conflict(f"voice {voice_id!r} exists", code="voice_exists", param="voice_id")


async def register_voice(
    voices: VoiceRegistry,
    voice_id: str,
    audio: bytes,
    prompt_text: str,
    *,
    name: str = "",
    language: str = "mul",
    description: str = "",
    param: str = "prompt_wav",
) -> VoiceInfo:
    """Make a zero-shot voice from ``audio`` and its transcript, keep it on disk and serve it under ``voice_id``."""
    service = cloning_service(voices)
    check_voice_id(voices, voice_id)
    features = await features_of(service, audio, prompt_text, param)
    check_voice_id(voices, voice_id)  # registered by another request meanwhile?
    try:
        voice = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: service.register(voice_id, features, name=name, language=language, description=description),
        )
    except OSError as error:
        raise StorageFailed(f"could not save the voice: {error}", code="voice_not_saved") from error
    _check_free(voices, voice_id)  # not from the shared store, which now holds this voice's own file
    voices.add(voice)
    return voice.info


async def delete_voice(voices: VoiceRegistry, voice_id: str) -> None:
    """Stop serving a registered voice and remove it from disk (streams already speaking with it finish)."""
    service = cosyvoice(voices)
    sync_voice(voices, voice_id)  # registered by another replica, or deleted there
    voice = voices.get(voice_id)
    if voice is None or voice.info.source != "registered":
        raise Conflict(
            f"voice {voice_id!r} is not a registered voice and cannot be deleted",
            code="voice_not_deletable",
            param="voice_id",
        )
    try:
        voices.remove(voice_id)
    except ValueError as error:
        raise Conflict(f"{error}; change the server's settings first", code="voice_in_use", param="voice_id") from error
    await asyncio.get_running_loop().run_in_executor(None, service.unregister, voice_id)
