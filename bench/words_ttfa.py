"""What word timings cost before first audio: the same sentence with and without them, interleaved, in-process.

    python -m bench.words_ttfa [--rounds 60]

A transport that sends words (SSE, the WebSockets, WHEP) opens its stream with ``SynthesisRequest.words``; one that
sends none (plain ``/v1/audio/speech``, ``/inference_sft``, gRPC, Piper's API) does not, and the embedded voice then
skips the token timings it would work out in the encoder's step. Each round speaks ``bench.ttfa``'s short sentence
once each way on one idle engine (the order alternating by round), timing the engine's stream from ``open_stream`` to
its first audio chunk, and, apart from the engine, the voice's encoder step alone (phonemes, encoder, and the timings
or not). Figures: p50 of each, and the median of the per-round ratios (without / with), so that the machine's drift
within the run cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.models.piper.steps import EncodeJob
from rtvoice.engine.models.piper.voice import PiperVoice
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.stream import AudioChunk

TEXT = "The quick brown fox jumps over the lazy dog by the river."
"""``bench.ttfa``'s short sentence (its "10 words")."""


async def first_audio_s(engine: Engine, words: bool, seed: int) -> float:
    """Seconds from opening the stream to its first audio chunk (the rest is read to the end, untimed)."""
    start = time.perf_counter()
    stream = engine.open_stream(SynthesisRequest(text=TEXT, options=SynthesisOptions(seed=seed), words=words))
    first: float | None = None
    async for event in stream.events():
        if first is None and isinstance(event, AudioChunk):
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream made no audio")
    return first


def encode_s(voice: PiperVoice, words: bool, seed: int) -> float:
    """Seconds of one encoder step of ``TEXT`` (phonemes, encoder, and token timings when ``words``)."""
    config = voice.config
    job = EncodeJob(
        TEXT, np.random.default_rng(seed), config.length_scale, config.noise_scale, config.noise_w_scale, words
    )
    start = time.perf_counter()
    voice.run([job])
    return time.perf_counter() - start


def report(name: str, without: list[float], with_: list[float]) -> None:
    ratios = [a / b for a, b in zip(without, with_, strict=True)]
    print(
        f"{name:28} without words p50 {statistics.median(without) * 1e3:6.2f} ms   with words p50 "
        f"{statistics.median(with_) * 1e3:6.2f} ms   per-round ratio (without / with): median "
        f"{statistics.median(ratios):.3f}, quartiles {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f}"
    )


async def measure(rounds: int) -> None:
    engine = Engine(EngineSettings())
    await engine.start()
    try:
        voice = engine.voices.get(engine.voices.default_id)
        if not isinstance(voice, PiperVoice):
            raise RuntimeError("the default voice is not a Piper voice")
        for seed in range(3):  # warm both paths
            await first_audio_s(engine, True, seed)
            await first_audio_s(engine, False, seed)
        ttfa: dict[bool, list[float]] = {True: [], False: []}
        encode: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds):
            order = (True, False) if round_ % 2 else (False, True)
            for words in order:
                ttfa[words].append(await first_audio_s(engine, words, round_))
            for words in order:
                encode[words].append(encode_s(voice, words, round_))
        print(f"{rounds} rounds of {TEXT!r}")
        report("TTFA (engine, in-process)", ttfa[False], ttfa[True])
        report("encoder step alone", encode[False], encode[True])
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    asyncio.run(measure(args.rounds))


if __name__ == "__main__":
    main()
