"""Schemathesis over /openapi.json with the CosyVoice2 fixture loaded (stand-in front ends, so every prompt route
and voice registration runs): valid and invalid input, never a 5xx. Without the model: tests/test_fuzz.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.openapi_fuzz import fuzz_openapi

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("kaldi_native_fbank")


def test_openapi_routes_with_cosyvoice2_never_answer_5xx(
    start_server: Callable[..., Server], serving_model_dir: Path, tmp_path: Path
) -> None:
    server = start_server(
        cosyvoice_dir=str(serving_model_dir),
        cosyvoice_voices_dir=str(tmp_path / "voices"),
        max_text_chars="300",
        warmup="false",
    )  # short texts: the tiny model speaks slowly on a CPU
    statuses = fuzz_openapi(server.url, max_examples=4)
    assert any(200 <= status < 300 for status in statuses) and any(400 <= status < 500 for status in statuses)
