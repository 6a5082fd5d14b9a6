"""A Piper decoder chunk as exported (1-D convolutions) against the same chunk with them as 2-D ones, on this machine.

    python -m bench.decoder_layout

Each chunk size the plan makes (first chunk to the largest, context included) runs through both forms, alternating,
in one process; the table gives the fastest of the repeats of each and their ratio (below 1: the 2-D form is faster),
and the largest difference between their audio. ``PiperVoice`` makes the same comparison at the largest chunk when it
loads and keeps the faster form.
"""

from __future__ import annotations

import numpy as np
import onnxruntime

from rtvoice.engine.models.piper import layout
from rtvoice.engine.models.piper.voice import PiperVoice, _session_options
from rtvoice.engine.voices import embedded_voice_path


def main(repeats: int = 7) -> None:
    voice = PiperVoice(embedded_voice_path())
    decoder = voice.graphs.decoder
    rewritten = layout.two_dimensional(decoder)
    channels = layout.input_channels(decoder)
    if rewritten is None or channels is None:
        print("this voice's decoder has no convolutions to rewrite")
        return
    options = _session_options(1)
    exported = onnxruntime.InferenceSession(decoder.model, options, providers=["CPUExecutionProvider"])
    two_d = onnxruntime.InferenceSession(rewritten.model, options, providers=["CPUExecutionProvider"])
    g = voice.geometry
    print(f"{'chunk frames':>12} {'audio ms':>8} {'exported ms':>11} {'2-D ms':>7} {'ratio':>6} {'max diff':>9}")
    frames = g.first_chunk
    while True:
        size = voice.planner.chunk_size(frames)
        feeds = {
            voice.graphs.latent: np.random.default_rng(frames).standard_normal((1, channels, size), dtype=np.float32)
        }
        c = layout.compare(exported, two_d, feeds, repeats)
        print(
            f"{frames:12d} {frames * g.frame_s * 1e3:8.0f} {c.exported_s * 1e3:11.1f} {c.two_d_s * 1e3:7.1f} "
            f"{c.two_d_s / c.exported_s:6.2f} {c.difference:9.1e}"
        )
        if frames >= 3 * g.max_chunk:
            break
        frames = min(3 * g.max_chunk, frames * 2)


if __name__ == "__main__":
    main()
