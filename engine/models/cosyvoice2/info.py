"""What the rest of rtvoice knows of CosyVoice2 without importing torch: the model's name, its speakers' ids,
the one speed it streams at. The transports (app/cosyvoice_api.py) check a request with these before a model
call; the voices hold to the same rules."""

from __future__ import annotations

from rtvoice.engine.models.base import SynthesisOptions

MODEL_NAME = "cosyvoice2"
"""``VoiceInfo.model`` of every CosyVoice2 voice."""
SPEAKER_PREFIX = f"{MODEL_NAME}-"
"""What the ids of a model's ``spk2info.pt`` speakers start with."""
STREAMING_SPEED = 1.0
MAX_RECORDING_BYTES = 50 * 1024 * 1024
"""The largest prompt recording read."""


def validate(options: SynthesisOptions) -> None:
    """Raise ValueError for options no CosyVoice2 voice honours."""
    if options.speed != STREAMING_SPEED:
        # The reference changes speed by stretching the mel of a whole utterance, which its streaming mode
        # refuses too; every CosyVoice2 stream here is streamed.
        raise ValueError(f"CosyVoice2 voices speak at speed {STREAMING_SPEED} only")
