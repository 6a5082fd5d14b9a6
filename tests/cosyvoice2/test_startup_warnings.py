"""CosyVoice2's degraded modes at start-up, as WARNING lines of a real server's log (the tiny fixture has no
tokenizer files and no prompt front end)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cosyvoice2.deps import require
from tests.test_startup_log import LINE, find, start_and_read_log

require("torch")
require("transformers")


def test_cosyvoice2_degraded_modes_are_warnings(tmp_path: Path, model_dir: Path) -> None:
    lines, _ = start_and_read_log(
        tmp_path, RTVOICE_COSYVOICE_DIR=str(model_dir), RTVOICE_DATA_DIR=str(tmp_path / "data"), RTVOICE_WARMUP="false"
    )
    assert all(LINE.match(line) for line in lines), "\n".join(lines)
    no_tokenizer = find(lines, r" WARNING +rtvoice\.engine\.models\.cosyvoice2\.frontend: .* has no tokenizer files")
    no_frontend = find(
        lines,
        r" WARNING +rtvoice\.engine\.models\.cosyvoice2\.service: .* has no "
        r"speech_tokenizer_v2\.onnx / campplus\.onnx: zero-shot, cross-lingual, instruct2",
    )
    loaded = find(
        lines,
        rf" INFO +rtvoice\.engine\.voices: loaded CosyVoice2 from {re.escape(str(model_dir))} "
        r"in \d+\.\d\d s",
    )
    ready = find(lines, r" INFO +rtvoice\.app\.main: ready: ")
    assert no_tokenizer < loaded and no_frontend < loaded < ready
