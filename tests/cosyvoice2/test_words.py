"""CosyVoice2 word timings: estimates (``approximate``), ordered, inside the audio, never after it.

The fixture's random weights make noise, so nothing here says where words really are; the estimate's rules are
checked: words in order, spread inside each segment's audio, handed out before the audio that holds their start."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.stream import AudioChunk, SegmentDone, WordTiming
from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")
require("kaldi_native_fbank")

TEXT = "Hi, $5 each. Then more."
"""Short: the tiny model makes the most tokens its text allows, slowly on a CPU."""


def stream_events(service: Any, voice: Any, text: str, seed: int) -> list[object]:
    from rtvoice.engine.engine import Engine
    from rtvoice.engine.settings import EngineSettings
    from rtvoice.engine.voices import VoiceRegistry

    registry = VoiceRegistry([voice])
    registry.cosyvoice = service

    async def run() -> list[object]:
        engine = Engine(EngineSettings(warmup=False), voices=registry)
        await engine.start()
        try:
            stream = engine.open_stream(
                SynthesisRequest(text=text, voice=voice.info.id, options=SynthesisOptions(seed=seed), words=True)
            )
            return [event async for event in stream.events()]
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_cosyvoice2_words_are_marked_estimates_inside_their_audio(serving_service: Any) -> None:
    voice = next(iter(serving_service.speakers.values()))
    received = stream_events(serving_service, voice, TEXT, seed=2)
    words = [e for e in received if isinstance(e, WordTiming)]
    assert [w.text for w in words] == ["Hi", "$5", "each", "Then", "more"]
    assert all(w.approximate and TEXT[w.start : w.end] == w.text for w in words)
    sent = 0.0
    segment_ends: list[float] = []
    for event in received:
        if isinstance(event, AudioChunk):
            sent += event.duration_s
        elif isinstance(event, SegmentDone):
            segment_ends.append(sent)
        elif isinstance(event, WordTiming):
            assert event.start_s >= sent - 1e-9, f"{event.text} came after its audio"
    for before, after in pairwise(words):
        assert before.start_s <= after.start_s
    # Starts lie in the audio; an estimated end can pass it when a segment turns out shorter than estimated.
    assert all(0 <= w.start_s <= sent and w.end_s >= w.start_s for w in words)
    # Each segment's words lie in its own audio: the second sentence's start after the first one's audio.
    assert len(segment_ends) == 2
    assert all(w.start_s < segment_ends[0] for w in words[:3])
    assert all(w.start_s >= segment_ends[0] - 1e-6 for w in words[3:])
