"""Fixtures for the CosyVoice2 tests: the parity fixture directory (outside the repo), its vectors,
and the model loaded from it once per session. Max errors are collected and printed at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import torch
except ImportError:  # the test modules skip themselves; the fixtures here are then never used
    torch = None  # type: ignore[assignment]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURE = REPO_ROOT.parent / "shared" / "fixtures" / "cosyvoice2-tiny"

PARITY_ERRORS: dict[str, float] = {}
"""vector name -> max abs error, gathered from the parity tests' reports (from every pytest-xdist worker), printed in
the terminal summary."""
PARITY_PROPERTY = "parity_error"


def fixture_dir() -> Path:
    return Path(os.environ.get("RTVOICE_COSYVOICE2_FIXTURE", str(DEFAULT_FIXTURE)))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    path = fixture_dir()
    if not (path / "vectors.pt").is_file():
        message = f"CosyVoice2 parity fixture not found at {path} (set RTVOICE_COSYVOICE2_FIXTURE)"
        if os.environ.get("RTVOICE_REQUIRE_FIXTURES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session", autouse=True)
def _single_thread() -> Iterator[None]:
    # These models are tiny; on a shared 2-core box, OpenMP threads spinning against other
    # processes make each call 10-50x slower than one thread.
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def vectors(model_dir: Path) -> dict[str, Any]:
    return torch.load(model_dir / "vectors.pt", weights_only=True)


@pytest.fixture(scope="session")
def model(model_dir: Path) -> Any:
    from rtvoice.engine.models.cosyvoice2 import CosyVoice2Model

    m = CosyVoice2Model.load(model_dir)
    # The vectors were made with the sine source's random phase and noise at zero.
    m.hift.m_source.random_source = False
    return m


@pytest.fixture
def record_error(record_property: Any) -> Any:
    def record(name: str, expected: Any, actual: Any) -> float:
        assert tuple(actual.shape) == tuple(expected.shape), (
            f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        )
        err = float((actual.float() - expected.float()).abs().max()) if expected.numel() else 0.0
        record_property(PARITY_PROPERTY, (name, err))  # the report carries it back from a worker
        return err

    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == PARITY_PROPERTY:
            name, err = value
            PARITY_ERRORS[name] = err


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not PARITY_ERRORS:
        return
    terminalreporter.section("CosyVoice2 parity: max abs error per vector")
    width = max(len(k) for k in PARITY_ERRORS)
    for name, err in PARITY_ERRORS.items():
        terminalreporter.write_line(f"{name:<{width}}  {err:.3e}")


@pytest.fixture(scope="session")
def serving_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's files symlinked, plus stand-in speech tokenizer / CAM++ ONNX models and a spk2info.pt
    (see ``standins.py``: they stand in for weights we cannot download, not for code under test)."""
    from tests.cosyvoice2.standins import serving_model_dir as build

    return build(model_dir, tmp_path_factory.mktemp("cosyvoice2-serving") / "model")


@pytest.fixture(scope="session")
def serving_service(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A CosyVoice2Service on the serving directory (its own model instance), voices in a temp dir."""
    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service

    return CosyVoice2Service.load(serving_model_dir, tmp_path_factory.mktemp("cosyvoice2-voices"))
