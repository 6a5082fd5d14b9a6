"""The CosyVoice2 tests' optional dependencies (the ``cosyvoice`` extra): a test module without them is skipped,
unless ``RTVOICE_REQUIRE_FIXTURES=1`` (CI), where a missing one fails the run instead."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def fixtures_required() -> bool:
    return os.environ.get("RTVOICE_REQUIRE_FIXTURES") == "1"


def require(name: str) -> ModuleType:
    """Import ``name``; without it, skip the calling test module, or fail it when fixtures are required."""
    if not fixtures_required():
        return pytest.importorskip(name)
    try:
        return importlib.import_module(name)
    except ImportError as error:
        pytest.fail(f"{name} is not importable and RTVOICE_REQUIRE_FIXTURES=1: {error}", pytrace=False)
