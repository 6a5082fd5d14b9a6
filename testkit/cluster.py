"""rtvoice replicas behind HAProxy on loopback, through ``deploy/local-cluster.sh`` (what an operator runs), for the
cluster tests and ``bench.cluster``; and the Debian tools the deployment tests need (haproxy, turnserver,
promtool), skipped when missing unless RTVOICE_REQUIRE_DEPLOY_TOOLS=1."""

from __future__ import annotations

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from testkit.servers import seed_caches

REPO = Path(__file__).resolve().parent.parent
LOCAL_CLUSTER = REPO / "deploy" / "local-cluster.sh"


class MissingTool(Exception):
    """A Debian package a deployment test needs is not installed."""


def require_tool(name: str, package: str) -> str:
    """The path of ``name``; MissingTool naming the Debian package (``make deploy-tools`` installs it) when absent."""
    path = shutil.which(name)
    if path is None:
        raise MissingTool(f"{name} is missing: apt-get install {package} (make deploy-tools, as root)")
    return path


def skip_or_fail(missing: MissingTool) -> None:
    """Skip a test for a missing tool; fail it instead under RTVOICE_REQUIRE_DEPLOY_TOOLS=1."""
    import pytest

    if os.environ.get("RTVOICE_REQUIRE_DEPLOY_TOOLS") == "1":
        pytest.fail(f"{missing} and RTVOICE_REQUIRE_DEPLOY_TOOLS=1")
    pytest.skip(str(missing))


def free_port_range(count: int, attempts: int = 50) -> int:
    """A base port such that it and the ``count - 1`` ports after it are free on loopback now."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count >= 65536:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} free consecutive ports on loopback")


@dataclass
class LocalCluster:
    """N replicas (r1..rN) and HAProxy, started by ``deploy/local-cluster.sh up N PORT`` in ``state``."""

    replicas: int
    port: int
    state: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        """The balancer."""
        return f"http://127.0.0.1:{self.port}"

    def replica_url(self, k: int) -> str:
        return f"http://127.0.0.1:{self.port + k}"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.port + 2 * self.replicas + 1}"

    def script(self, *args: str, timeout: float = 600) -> str:
        """Run ``deploy/local-cluster.sh`` with ``args``; its output (RuntimeError with it when it fails)."""
        done = subprocess.run(
            [str(LOCAL_CLUSTER), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"local-cluster.sh {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def pid(self, k: int) -> int:
        return int((self.state / f"r{k}.pid").read_text())

    def kill(self, k: int) -> None:
        """``kill -9`` replica k: no drain, its connections reset."""
        os.kill(self.pid(k), signal.SIGKILL)

    def servers(self) -> dict[str, tuple[str, int]]:
        """HAProxy's view of each replica: its status (UP, DOWN, DRAIN, ...) and weight, from its stats CSV."""
        text = httpx.get(f"{self.stats_url}/stats;csv", timeout=5).text.lstrip("# ")
        return {
            row["svname"]: (row["status"], int(row["weight"] or 0))
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == "replicas" and row["svname"] != "BACKEND"
        }

    def log(self, k: int) -> str:
        return (self.state / f"r{k}.log").read_text(errors="replace")


def start_cluster(replicas: int, state: Path, env: dict[str, str] | None = None) -> LocalCluster:
    """``local-cluster.sh up`` on free ports, with ``env`` (RTVOICE_* settings for the replicas) added; the replicas
    share ``state/data`` (seeded with the default data directory's caches)."""
    require_tool("haproxy", "haproxy")
    data = state / "data"
    seed_caches(data)
    port = free_port_range(2 * replicas + 2)
    full_env = {
        **os.environ,
        "LOCAL_CLUSTER_DIR": str(state),
        "RTVOICE_DATA_DIR": str(data),
        "RTVOICE_LOG_LEVEL": "warning",
        **(env or {}),
    }
    full_env.setdefault("PATH", "/usr/bin:/bin")
    # The replicas run this checkout's interpreter's rtvoice (a test run's virtualenv).
    venv_bin = str(Path(sys.executable).parent)
    full_env["PATH"] = f"{venv_bin}:{full_env['PATH']}"
    cluster = LocalCluster(replicas, port, state, full_env)
    out = cluster.script("up", str(replicas), str(port))
    lines = out.split()
    if lines[-2:] != [cluster.url, "ready"]:
        cluster.script("down")
        raise RuntimeError(f"local-cluster.sh up printed {out!r}")
    return cluster
