"""How long, and how well heard, the embedded voice is at other speeds: its own (``engine/models/piper/pace.py``)
against WSOLA (``engine/audio/stretch.py``) on its speed-1 audio, in the same run.

    python -m bench.speed --speeds 1.5 2 --seeds 1 2 3 4 5 6

For each speed, over ``testkit.alignment.SENTENCES`` and the seeds: the median length against speed 1, and
PocketSphinx's word error rate (free decoding) against the words as spoken. A free recogniser misses much of any
fast speech: compare the rows with one another.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from bench.normalize_wer import errors
from rtvoice.engine.audio.stretch import TimeStretch
from rtvoice.engine.engine import Engine
from rtvoice.engine.settings import EngineSettings
from testkit.alignment import ALIGNER_RATE, SENTENCES, speak, transcribe


def stretched(pcm: np.ndarray, speed: float) -> np.ndarray:
    audio = TimeStretch(speed, ALIGNER_RATE).process(pcm.astype(np.float32) / 32767, last=True)
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


async def measure(speeds: list[float], seeds: list[int]) -> None:
    engine = Engine(EngineSettings(warmup=False))
    await engine.start()
    try:
        for speed in speeds:
            await measure_speed(engine, speed, seeds)
    finally:
        await engine.stop()


async def measure_speed(engine: Engine, speed: float, seeds: list[int]) -> None:
    lengths: dict[str, list[float]] = {"voice": [], "WSOLA": []}
    wrong = dict.fromkeys(lengths, 0)
    words = 0
    for text, spoken in SENTENCES:
        reference = spoken.replace("|", " ").split()
        for seed in seeds:
            normal, _ = await speak(engine, text, seed)
            paced, _ = await speak(engine, text, seed, speed=speed)
            words += len(reference)
            for way, pcm in {"voice": paced, "WSOLA": stretched(normal, speed)}.items():
                lengths[way].append(len(pcm) / len(normal))
                wrong[way] += errors(reference, transcribe(pcm))
    for way in lengths:
        print(f"{speed:>6.2f} {way:>8} {np.median(lengths[way]):>7.3f} {wrong[way] / words:>6.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.5, 2.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"{'speed':>6} {'way':>8} {'length':>7} {'WER':>6}")
    asyncio.run(measure(args.speeds, args.seeds))


if __name__ == "__main__":
    main()
