"""What the engine makes of a request in-process, to compare a transport's bytes against."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import numpy as np

from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.voices import VoiceRegistry, embedded_voice_path

EMBEDDED_VOICE_RATE: int = json.loads(Path(f"{embedded_voice_path()}.json").read_text())["audio"]["sample_rate"]
"""The embedded voice's own rate, from its config: what routes answer at unless asked for another."""


@functools.cache
def default_voices() -> VoiceRegistry:
    """The default settings' voices, loaded once per test process: the in-process references share them (a voice's
    load measures and times it for seconds; what it measured is the same for every engine)."""
    return VoiceRegistry.load(EngineSettings(warmup=False))


def reference_engine() -> Engine:
    """An engine of the default settings without warm-up (nothing measured yet), on the shared voices."""
    return Engine(EngineSettings(warmup=False), voices=default_voices())


def synthesize(
    text: str, seed: int, sample_rate: int | None = None, voice: str | None = None, speed: float = 1.0
) -> np.ndarray:
    """int16 samples of ``text`` as the default engine streams them."""

    async def run() -> np.ndarray:
        engine = reference_engine()
        await engine.start()
        try:
            stream = engine.open_stream(
                SynthesisRequest(
                    text=text, voice=voice, sample_rate=sample_rate, options=SynthesisOptions(speed=speed, seed=seed)
                )
            )
            chunks = [pcm async for pcm in stream.audio()]
        finally:
            await engine.stop()
        return np.concatenate(chunks)

    return asyncio.run(run())
