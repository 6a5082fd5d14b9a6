"""Start servers on loopback for tests and benchmarks: rtvoice itself, and Piper's own HTTP server."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from testkit.polling import wait_for

REPO = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when the thread that started it dies."""


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Each sample of ``name`` in /metrics: its labels and value."""
        return samples(self.url, name)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the samples of ``name`` in /metrics that carry ``labels`` (0 when absent)."""
        return metric(self.url, name, labels)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample in the /metrics of the server at ``url``, read once: its name, labels and value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of ``name`` in the /metrics of the server at ``url``: its labels and value."""
    return [(labels, value) for sample_name, labels, value in scrape(url) if sample_name == name]


def metrics(url: str, names: Sequence[str], labels: dict[str, str] | None = None) -> dict[str, float]:
    """For each of ``names``, the sum of its samples that carry ``labels`` (0 when absent), from one read of the
    /metrics of the server at ``url``, so that they describe one moment."""
    sums = dict.fromkeys(names, 0.0)
    for name, sample_labels, value in scrape(url):
        if name in sums and all(sample_labels.get(k) == v for k, v in (labels or {}).items()):
            sums[name] += value
    return sums


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` in the /metrics of the server at ``url`` that carry ``labels`` (0 when
    absent)."""
    return metrics(url, (name,), labels)[name]


CACHES = ("measured", "int8", "stages")
"""What a start keeps in its data directory for the next start of the same weights (context frames and timed
choices, the quantized decoder)."""


def seed_caches(data_dir: Path) -> None:
    """Copy the default data directory's caches into ``data_dir``, so that a server started on it (a cluster's
    replicas, a test's own data) does not remake them."""
    import shutil

    from rtvoice.app.settings import Settings

    for cache in CACHES:
        if (Settings().data_dir / cache).is_dir():
            shutil.copytree(Settings().data_dir / cache, data_dir / cache, dirs_exist_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child terminated when the thread starting it ends (tests and benchmarks start
    servers on their main thread: when the run dies), on Linux (None elsewhere): a run killed from outside, e.g.
    for memory, leaves no server behind holding a port and the CPUs."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def in_child() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the signal was asked for
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float = 240) -> None:
    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    if not wait_for(ready, timeout_s, interval=0.2):
        process.kill()
        raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def start_rtvoice(
    env: dict[str, str] | None = None,
    quiet: bool = True,
    log_file: Path | None = None,
    command: list[str] | None = None,
    cwd: Path = REPO,
) -> Server:
    """rtvoice as its own process on a free loopback port; returns once /readyz says ready.

    With ``log_file`` its standard output and error (where the logs go) are written there. ``command``
    replaces ``python -m rtvoice.app.cli serve`` (e.g. another installation's ``rtvoice serve``).
    """
    port = free_port()
    full_env = {
        **os.environ,
        "RTVOICE_HOST": "127.0.0.1",
        "RTVOICE_PORT": str(port),
        "RTVOICE_LOG_LEVEL": "warning",
        **(env or {}),
    }
    command = command or [sys.executable, "-m", "rtvoice.app.cli", "serve"]
    if log_file is not None:
        with log_file.open("wb") as log:
            process = subprocess.Popen(
                command, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )
    else:
        process = subprocess.Popen(
            command, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL if quiet else None, preexec_fn=die_with_parent()
        )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(process, f"{url}/readyz")
    return Server(url, process)


def start_piper_http(model: Path) -> Server:
    """Piper's own Flask server (``piper-tts[http]``) with the same voice."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "piper.http_server", "-m", str(model), "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(),
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(process, f"{url}/info")
    return Server(url, process)
