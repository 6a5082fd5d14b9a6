"""What ``rtvoice serve`` logs as it starts, read from a real server process's output.

Every line has a timestamp, a level and a logger; the voices loaded and how long each took; where the server is
ready; each degraded mode as a WARNING; and no access lines for the probes polled meanwhile. CosyVoice2's warnings:
tests/cosyvoice2/test_startup_warnings.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from testkit.polling import wait_for
from testkit.servers import start_rtvoice

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
    assert not any("uvicorn.access" in line for line in lines), "one access log: rtvoice's"
    skipped = find(lines, r" WARNING +rtvoice\.engine\.voices: skipping .*half\.onnx: no half\.onnx\.json")
    loaded = find(
        lines,
        r" INFO +rtvoice\.engine\.voices: loaded voice en_US-joe-medium \(piper, en_US, 22050 Hz\) "
        r"in \d+\.\d\d s",
    )
    warmed = find(
        lines,
        r" INFO +rtvoice\.engine\.voices: warmed up the voices in \d+\.\d\d s: "
        r"en_US-joe-medium \d+\.\d\d s",
    )
    ready = find(
        lines,
        rf" INFO +rtvoice\.app\.main: ready: the page at {re.escape(url)}/, API docs at "
        rf"{re.escape(url)}/docs; default voice en_US-joe-medium",
    )
    assert skipped < loaded < warmed < ready
    find(lines, rf" INFO +uvicorn: Uvicorn running on {re.escape(url)}")
    find(
        lines,
        r' INFO +rtvoice\.access: 127\.0\.0\.1:\d+ "GET /voices HTTP/1\.1" 200 route=/voices key=- '
        r"ttfa_ms=- audio_s=0 request_id=req_[0-9a-f]{32}$",
    )
    assert not any("GET /readyz" in line for line in lines), "probe requests stay out of the access log"
