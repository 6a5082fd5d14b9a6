"""CosyVoice2 inference (LM, flow, HiFT) in plain torch + transformers.

Entry point: :meth:`CosyVoice2Model.load`; ``PARITY.md`` says how it matches the reference.
Names are imported lazily so that ``config`` stays usable without torch installed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointError": "loader",
    "CosyVoice2Config": "config",
    "CosyVoice2Model": "model",
    "FlowPrompt": "token2wav",
    "LMStream": "llm",
    "Qwen2LM": "llm",
    "Token2Wav": "token2wav",
    "Token2WavStream": "token2wav",
    "load_config": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
