"""Shared fixtures: a real rtvoice server on loopback, started as its own process, and the embedded voice."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.browser import Missing, launch_chromium, skip_or_fail
from testkit.servers import Server, start_rtvoice

__all__ = ["Server", "settled_audio_seconds"]

# Voices stay fp32 in the suite (in-process engines and every server it starts inherit this): building a voice's int8
# parts takes minutes of CPU on a fresh data directory. tests/test_piper_int8.py asks for int8 itself.
os.environ.setdefault("RTVOICE_PIPER_INT8", "off")

PCM_SAMPLE_BYTES = 2


def settled_audio_seconds(server: Server) -> float:
    """The audio seconds the server has made, read once streams cancelled just before can make no more: a whole
    short request is made after reading it, during which the count must grow by that request's audio alone (so
    a cancelled stream that went on making audio fails here, instead of a sleep hoping to catch it)."""
    made = server.metric("rtvoice_audio_seconds_total")
    follow = httpx.post(f"{server.url}/inference_sft", data={"tts_text": "Okay.", "format": "pcm"}, timeout=60)
    assert follow.status_code == 200, follow.text
    follow_s = len(follow.content) / PCM_SAMPLE_BYTES / int(follow.headers["x-sample-rate"])
    grew = server.metric("rtvoice_audio_seconds_total") - made
    assert grew == pytest.approx(follow_s, abs=0.05), "audio was made for a cancelled stream meanwhile"
    return made


def left_by_a_crash(*paths: Path) -> None:
    """Make ``paths`` older than ``durable.UNFINISHED_AFTER_S``: part-written files that no live save still owns."""
    from rtvoice.engine import durable

    crashed = time.time() - durable.UNFINISHED_AFTER_S - 1
    for path in paths:
        os.utime(path, (crashed, crashed))


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The default server: embedded voice, default settings."""
    srv = start_rtvoice()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def start_server() -> Iterator[Callable[..., Server]]:
    """Start extra servers with other settings (RTVOICE_* overrides); all stop at the end of the session.

    A test whose server's behaviour does not follow from measured costs (keys, limits, protocols, fuzzing) passes
    ``warmup="false"``: the start then skips warming and calibrating the voices, about half its time."""
    started: list[Server] = []

    def start(**env: str) -> Server:
        srv = start_rtvoice({f"RTVOICE_{k.upper()}": v for k, v in env.items()})
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def piper_measured_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where ``piper_voice`` keeps the context frames it measured (empty before it loads)."""
    return tmp_path_factory.mktemp("measured")


@pytest.fixture(scope="session")
def piper_voice(piper_measured_dir: Path):  # type: ignore[no-untyped-def]
    """The embedded voice, loaded in-process for model-level checks (its contexts measured, not read back)."""
    from rtvoice.engine.models.piper.voice import PiperVoice
    from rtvoice.engine.voices import embedded_voice_path

    voice = PiperVoice(embedded_voice_path(), measured_dir=piper_measured_dir)
    voice.warmup()
    return voice


@pytest.fixture(scope="session")
def cosyvoice_stubs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Client modules generated from rtvoice's cosyvoice.proto the way CosyVoice's own client has them
    (top-level ``cosyvoice_pb2`` and ``cosyvoice_pb2_grpc``), imported: ``(messages, services)``."""
    import importlib
    import sys

    from rtvoice.app.cosyvoice_grpc.generate import generate

    directory = tmp_path_factory.mktemp("cosyvoice-client")
    for name, text in generate(package_path=None).items():
        (directory / name).write_text(text)
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    return importlib.import_module("cosyvoice_pb2"), importlib.import_module("cosyvoice_pb2_grpc")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Headless Chromium (Playwright); skipped when missing, failed instead under RTVOICE_REQUIRE_BROWSER=1."""
    with ExitStack() as stack:
        try:
            browser = stack.enter_context(launch_chromium())
        except Missing as missing:
            skip_or_fail(missing)
        yield browser
