"""Servers started for tests and benchmarks die with the run that started them, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from testkit.polling import wait_for
from testkit.servers import REPO

RUN = """
import sys
from testkit.servers import start_rtvoice
server = start_rtvoice({"RTVOICE_WARMUP": "false"})
print(server.url, server.process.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_dies_with_a_run_killed_from_outside() -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", RUN], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert run.stdout is not None
        url, pid = run.stdout.readline().split()
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        run.send_signal(signal.SIGKILL)  # no cleanup runs in the killed process
        run.wait(timeout=10)
        assert wait_for(lambda: _gone(int(pid)), 20), "the server outlived the run that started it"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/readyz", timeout=2)
    finally:
        run.kill()
        if "pid" in locals() and not _gone(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
