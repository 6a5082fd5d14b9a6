"""Cost of batched model calls against the same steps run one by one, per Piper stage, on this machine.

    python -m bench.batch_calls

The scheduler's per-kind batch limits for Piper (``PiperVoice.BATCH_LIMITS``) come from this table: a ratio
below 1 means one batched call beats the same steps run singly. Encoder passes are measured twice: on one text
repeated, and on texts of different lengths that share a batch key (its size bucket), as real requests do; a
batched pass pads every text to the longest.
"""

from __future__ import annotations

import time

from rtvoice.engine.models.base import Step, SynthesisOptions
from rtvoice.engine.models.piper.voice import PiperVoice
from rtvoice.engine.voices import embedded_voice_path

TEXT = "The quick brown fox jumps over the lazy dog near the river."
MIXED = [
    "Thanks for calling.",
    "One moment while I look that up for you.",
    "Your order left our warehouse this morning,",
    "Good afternoon.",
    "It seems the card on file expired last month.",
    "Would you like that?",
    "Please bring a photo card when you come.",
    "The next train runs an hour later.",
]
"""Texts of one encoder size bucket (under 64 characters), of different lengths."""


def first_step(voice: PiperVoice, kind: str, seed: int, text: str = TEXT) -> Step:
    """The first step of ``kind`` (a full-size chunk for the decoder) of a fresh stream speaking ``text``."""
    session = voice.open_session(SynthesisOptions(seed=seed))
    session.add_segment(text)
    while True:
        step = session.next_step()
        assert step is not None
        full_chunk = step.kind != "decode" or step.payload.end - step.payload.start >= voice.geometry.max_chunk
        if step.kind == kind and full_chunk:
            return step
        (result,) = voice.run([step.payload])
        session.complete(step, result)


def main(repeats: int = 3) -> None:
    voice = PiperVoice(embedded_voice_path())
    voice.warmup()
    print(f"{'kind':8} {'batch':>5} {'batched ms':>11} {'singly ms':>10} {'ratio':>6}")
    for name, kind in (("encode", "encode"), ("mixed", "encode"), ("flow", "flow"), ("decode", "decode")):
        for size in (1, 2, 4, 8):
            texts = MIXED[:size] if name == "mixed" else [TEXT] * size
            payloads = [first_step(voice, kind, seed, text).payload for seed, text in enumerate(texts)]
            voice.run(payloads)
            start = time.perf_counter()
            for _ in range(repeats):
                voice.run(payloads)
            batched = (time.perf_counter() - start) / repeats
            start = time.perf_counter()
            for _ in range(repeats):
                for payload in payloads:
                    voice.run([payload])
            singly = (time.perf_counter() - start) / repeats
            print(f"{name:8} {size:5d} {batched * 1e3:11.1f} {singly * 1e3:10.1f} {batched / singly:6.2f}")


if __name__ == "__main__":
    main()
