"""Word timings of the embedded voice against an independent forced aligner (PocketSphinx).

    python -m bench.word_timing

Each sentence is spoken by the engine in-process at 16 kHz (the aligner's rate, so the timings also go through
the resampler), with its word timings. PocketSphinx (its own en-US acoustic model and dictionary, shipped in the
wheel) aligns the audio to the words as spoken ("$100" is "one hundred dollars"), and each word's start is
compared with the start of the aligner's first word for it. The figure is the mean absolute error of word starts
per sentence and overall (target: 80 ms or less). The reference in the same run is the estimate a voice without
durations gets (``approximate``: each word's place in the text spread over the audio): what knowing the model's
durations buys.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass

from rtvoice.engine.engine import Engine
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.stream import WordTiming
from rtvoice.engine.text import Segmenter
from testkit.alignment import ALIGNER_RATE, SENTENCES, forced_alignment, speak


@dataclass(frozen=True)
class SentenceResult:
    text: str
    words: list[WordTiming]
    aligned_starts: list[float]
    audio_s: float

    @property
    def errors_s(self) -> list[float]:
        return [word.start_s - aligned for word, aligned in zip(self.words, self.aligned_starts, strict=True)]

    @property
    def mae_s(self) -> float:
        return statistics.fmean(abs(e) for e in self.errors_s)


def estimated(text: str, words: list[WordTiming], audio_s: float) -> list[float]:
    """The reference: each word's place in its text (by characters) spread over the audio, as for a voice without
    durations (one segment)."""
    segmenter = Segmenter(10_000, 10_000)
    segments = segmenter.push(text) + segmenter.flush()
    if len(segments) != 1 or len(segments[0].words) != len(words):
        raise RuntimeError("the reference needs the sentence as one segment")
    segment = segments[0]
    return [audio_s * word.spoken_start / len(segment.text) for word in segment.words]


async def measure(seed: int = 1) -> list[SentenceResult]:
    engine = Engine(EngineSettings(warmup=False))
    await engine.start()
    try:
        results = []
        for text, spoken in SENTENCES:
            pcm, words = await speak(engine, text, seed)
            groups = spoken.split("|")
            if len(groups) != len(words):
                raise RuntimeError(f"{text!r}: {len(words)} words timed, {len(groups)} spoken groups")
            results.append(SentenceResult(text, words, forced_alignment(pcm, groups), len(pcm) / ALIGNER_RATE))
        return results
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="runs per sentence (a seed each)")
    args = parser.parse_args()
    per_sentence: dict[str, list[float]] = {}
    reference: dict[str, list[float]] = {}
    all_errors: list[float] = []
    reference_errors: list[float] = []
    for seed in range(1, args.seeds + 1):
        for result in asyncio.run(measure(seed)):
            per_sentence.setdefault(result.text, []).extend(abs(e) for e in result.errors_s)
            all_errors.extend(result.errors_s)
            guess = estimated(result.text, result.words, result.audio_s)
            ref = [g - a for g, a in zip(guess, result.aligned_starts, strict=True)]
            reference.setdefault(result.text, []).extend(abs(e) for e in ref)
            reference_errors.extend(ref)
    print(
        f"word start error against PocketSphinx's forced alignment, {args.seeds} seeds "
        "(mean absolute error, ms; reference: spread by characters)"
    )
    for text, errors in per_sentence.items():
        print(
            f"  {statistics.fmean(errors) * 1000:6.1f}   ref {statistics.fmean(reference[text]) * 1000:6.1f}   {text}"
        )
    overall = statistics.fmean(abs(e) for e in all_errors) * 1000
    print(
        f"  overall MAE {overall:.1f} ms (mean signed {statistics.fmean(all_errors) * 1000:+.1f} ms, "
        f"max {max(abs(e) for e in all_errors) * 1000:.0f} ms, {len(all_errors)} words); "
        f"reference MAE {statistics.fmean(abs(e) for e in reference_errors) * 1000:.1f} ms; target <= 80 ms"
    )


if __name__ == "__main__":
    main()
