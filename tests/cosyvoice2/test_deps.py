"""RTVOICE_REQUIRE_FIXTURES=1 turns a missing torch or transformers into a failure, not a skipped module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# pytest in a child process in which ``import <module>`` fails, as in an environment without it
RUN_WITHOUT = "import sys; sys.modules[sys.argv[1]] = None; import pytest; sys.exit(pytest.main(sys.argv[2:]))"


def run_without(module: str, require_fixtures: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RTVOICE_REQUIRE_FIXTURES"}
    if require_fixtures:
        env["RTVOICE_REQUIRE_FIXTURES"] = "1"
    args = [
        sys.executable,
        "-c",
        RUN_WITHOUT,
        module,
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/cosyvoice2/test_sampling.py",
    ]
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_a_missing_dependency_fails_when_fixtures_are_required(module: str) -> None:
    result = run_without(module, require_fixtures=True)
    assert result.returncode != 0, result.stdout
    assert f"{module} is not importable and RTVOICE_REQUIRE_FIXTURES=1" in result.stdout


def test_a_missing_dependency_skips_otherwise() -> None:
    result = run_without("torch", require_fixtures=False)
    # the module is skipped whole: pytest then reports no test collected (5), which is no failure
    assert result.returncode in (0, pytest.ExitCode.NO_TESTS_COLLECTED), result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "could not import 'torch'" in result.stdout
