"""The ``rtvoice`` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.audio import parse_wav, rms

REPO = Path(__file__).resolve().parent.parent


def test_say_writes_a_wav(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    result = subprocess.run([sys.executable, "-m", "rtvoice.app.cli", "say", "Hello from the command line.", "-o", str(out),
                             "--sample-rate", "16000"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    header, samples = parse_wav(out.read_bytes())
    assert header["sample_rate"] == 16000 and header["data_size"] == 2 * len(samples)
    assert 1.0 < len(samples) / 16000 < 4.0 and rms(samples) > 0.01


def test_say_rejects_empty_text(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "rtvoice.app.cli", "say", "  ", "-o", str(tmp_path / "x.wav")], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "empty" in result.stderr
    assert not (tmp_path / "x.wav").exists()
