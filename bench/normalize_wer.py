"""How well numbers, dates, money and abbreviations come across: a recogniser's word error rate on them.

    python -m bench.normalize_wer

Each sentence is spoken by rtvoice (``/inference_sft`` at 16 kHz, ``normalize`` true, then false) and by Piper's
own synthesis of the same voice, in the same run; PocketSphinx (its en-US model, free decoding) transcribes each,
and the transcript is scored against how a person reads the sentence. Both sides are lower-cased and stripped of
punctuation, and titles are written short. PocketSphinx errs more than the recognisers users run, so compare the
rows with one another, not with figures from elsewhere.
"""

from __future__ import annotations

import re

import httpx
import numpy as np

from testkit.servers import start_rtvoice

SENTENCES = [
    ("He was born on 07/04/1990.", "he was born on july fourth nineteen ninety"),
    ("Mix 3/4 cup of flour with 2 tbsp. of sugar.", "mix three quarters cup of flour with two tablespoons of sugar"),
    ("Chapter IV begins on page 237.", "chapter four begins on page two hundred thirty seven"),
    ("The meeting moved to 10:45 a.m. on Tuesday.", "the meeting moved to ten forty five a m on tuesday"),
    (
        "Dr. Smith paid $1,250.75 on Jan. 5th.",
        "doctor smith paid one thousand two hundred fifty dollars and seventy five cents on january fifth",
    ),
    ("The train departs at 18:20.", "the train departs at eighteen twenty"),
    ("Revenue rose 15% to $3.2 million.", "revenue rose fifteen percent to three point two million dollars"),
    ("Keep it under 60 km/h.", "keep it under sixty kilometers per hour"),
    ("Henry VIII had six wives.", "henry the eighth had six wives"),
    ("It was 72°F in St. Louis.", "it was seventy two degrees fahrenheit in saint louis"),
    ("She finished 2nd of 1,500 runners.", "she finished second of one thousand five hundred runners"),
    ("Call 555-0199 after 5 p.m.", "call five five five zero one nine nine after five p m"),
]
RATE = 16_000


TITLES = {"doctor": "dr", "mister": "mr", "missus": "mrs", "saint": "st"}
"""Written the same on both sides, as Whisper's English normaliser does: the recogniser's dictionary spells some
titles short."""


def words(text: str) -> list[str]:
    return [TITLES.get(word, word) for word in re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()]


def errors(reference: list[str], hypothesis: list[str]) -> int:
    """Word edit distance."""
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != hyp))
    return row[-1]


def transcribe(pcm: np.ndarray) -> str:
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=RATE, loglevel="ERROR")
    decoder.start_utt()
    decoder.process_raw(pcm.astype("<i2").tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return "" if hypothesis is None else str(hypothesis.hypstr)


def rtvoice_pcm(client: httpx.Client, url: str, text: str, normalize: bool) -> np.ndarray:
    form = {
        "tts_text": text,
        "format": "pcm",
        "sample_rate": str(RATE),
        "seed": "1",
        "normalize": str(normalize).lower(),
    }
    response = client.post(f"{url}/inference_sft", data=form)
    response.raise_for_status()
    return np.frombuffer(response.content, dtype="<i2")


def piper_pcm(text: str) -> np.ndarray:
    import soxr
    from piper import PiperVoice

    from rtvoice.engine.voices import embedded_voice_path

    voice = PiperVoice.load(embedded_voice_path())
    audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text)])
    resampled = soxr.resample(audio, voice.config.sample_rate, RATE)
    return np.clip(resampled * 32767, -32768, 32767).astype(np.int16)


def main() -> None:
    systems = ("rtvoice", "rtvoice normalize=false", "piper")
    totals = dict.fromkeys(systems, 0)
    reference_words = 0
    server = start_rtvoice()
    try:
        with httpx.Client(timeout=120) as client:
            for text, spoken in SENTENCES:
                reference = words(spoken)
                reference_words += len(reference)
                heard = {
                    "rtvoice": transcribe(rtvoice_pcm(client, server.url, text, True)),
                    "rtvoice normalize=false": transcribe(rtvoice_pcm(client, server.url, text, False)),
                    "piper": transcribe(piper_pcm(text)),
                }
                print(text)
                for system in systems:
                    wrong = errors(reference, words(heard[system]))
                    totals[system] += wrong
                    print(f"  {system:24} {wrong:2d} errors  {heard[system]}")
    finally:
        server.stop()
    print(f"\nWER over {len(SENTENCES)} sentences ({reference_words} words)")
    for system in systems:
        print(f"  {system:24} {totals[system] / reference_words:6.1%}")


if __name__ == "__main__":
    main()
