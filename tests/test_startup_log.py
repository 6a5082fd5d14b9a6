"""What ``rtvoice serve`` logs as it starts, read from a real server process's output.

Every line has a timestamp, a level and a logger; the voices loaded and how long each took; where the server is
ready; each degraded mode as a WARNING; and no access lines for the probes polled meanwhile.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from bench.servers import start_rtvoice
from tests.cosyvoice2.conftest import fixture_dir
from tests.polling import wait_for

LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: \S")


def start_and_read_log(tmp_path: Path, **env: str) -> tuple[list[str], str]:
    """Start a server with ``env`` (RTVOICE_* names), make one request, stop it; its log lines and URL."""
    log_file = tmp_path / "server.log"
    server = start_rtvoice({"RTVOICE_LOG_LEVEL": "info", **env}, log_file=log_file)
    try:
        # The ready line is written before /readyz answers 200; wait for it all the same, not on a sleep.
        assert wait_for(lambda: " ready" in log_file.read_text(), timeout=10), log_file.read_text()
        assert httpx.get(f"{server.url}/voices").status_code == 200
        assert wait_for(lambda: "GET /voices" in log_file.read_text(), timeout=10), log_file.read_text()
    finally:
        server.stop()
    return log_file.read_text().splitlines(), server.url


def find(lines: list[str], pattern: str) -> int:
    """The index of the first line that matches ``pattern``."""
    matches = [index for index, line in enumerate(lines) if re.search(pattern, line)]
    assert matches, f"no line matches {pattern!r} in:\n" + "\n".join(lines)
    return matches[0]


def test_startup_log(tmp_path: Path) -> None:
    voices_dir = tmp_path / "voices"
    voices_dir.mkdir()
    (voices_dir / "half.onnx").write_bytes(b"")  # no half.onnx.json beside it: skipped, with a warning
    lines, url = start_and_read_log(tmp_path, RTVOICE_VOICES_DIR=str(voices_dir))
    assert lines and all(LINE.match(line) for line in lines), "\n".join(lines)
    skipped = find(lines, r" WARNING +rtvoice\.engine\.voices: skipping .*half\.onnx: no half\.onnx\.json")
    loaded = find(lines, r" INFO +rtvoice\.engine\.voices: loaded voice en_US-joe-medium \(piper, en_US, 22050 Hz\) "
                         r"in \d+\.\d\d s")
    warmed = find(lines, r" INFO +rtvoice\.engine\.voices: warmed up the voices in \d+\.\d\d s: "
                         r"en_US-joe-medium \d+\.\d\d s")
    ready = find(lines, rf" INFO +rtvoice\.app\.main: ready: the page at {re.escape(url)}/, API docs at "
                        rf"{re.escape(url)}/docs; default voice en_US-joe-medium")
    assert skipped < loaded < warmed < ready
    find(lines, rf" INFO +uvicorn: Uvicorn running on {re.escape(url)}")
    find(lines, r' INFO +uvicorn\.access: 127\.0\.0\.1:\d+ "GET /voices HTTP/1\.1" 200')
    assert not any("GET /readyz" in line for line in lines), "probe requests stay out of the access log"


def test_cosyvoice2_degraded_modes_are_warnings(tmp_path: Path) -> None:
    """The tiny CosyVoice2 fixture has no tokenizer files and no prompt front end: two warnings, in the format."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model_dir = fixture_dir()
    if not (model_dir / "cosyvoice2.yaml").is_file():
        message = f"CosyVoice2 fixture not found at {model_dir} (set RTVOICE_COSYVOICE2_FIXTURE)"
        if os.environ.get("RTVOICE_REQUIRE_FIXTURES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    lines, _ = start_and_read_log(tmp_path, RTVOICE_COSYVOICE_DIR=str(model_dir),
                                  RTVOICE_DATA_DIR=str(tmp_path / "data"), RTVOICE_WARMUP="false")
    assert all(LINE.match(line) for line in lines), "\n".join(lines)
    no_tokenizer = find(lines, r" WARNING +rtvoice\.engine\.models\.cosyvoice2\.frontend: .* has no tokenizer files")
    no_frontend = find(lines, r" WARNING +rtvoice\.engine\.models\.cosyvoice2\.service: .* has no "
                              r"speech_tokenizer_v2\.onnx / campplus\.onnx: zero-shot, cross-lingual, instruct2")
    loaded = find(lines, rf" INFO +rtvoice\.engine\.voices: loaded CosyVoice2 from {re.escape(str(model_dir))} "
                         r"in \d+\.\d\d s")
    ready = find(lines, r" INFO +rtvoice\.app\.main: ready: ")
    assert no_tokenizer < loaded and no_frontend < loaded < ready
