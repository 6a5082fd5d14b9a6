"""Shared fixtures: a real rtvoice server on loopback, started as its own process, and the embedded voice."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench.servers import Server, start_rtvoice

__all__ = ["Server"]


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The default server: embedded voice, default settings."""
    srv = start_rtvoice()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def start_server() -> Iterator[Callable[..., Server]]:
    """Start extra servers with other settings (RTVOICE_* overrides); all stop at the end of the session."""
    started: list[Server] = []

    def start(**env: str) -> Server:
        srv = start_rtvoice({f"RTVOICE_{k.upper()}": v for k, v in env.items()})
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def piper_voice():  # type: ignore[no-untyped-def]
    """The embedded voice, loaded in-process for model-level checks."""
    from rtvoice.engine.models.piper.voice import PiperVoice
    from rtvoice.engine.voices import embedded_voice_path

    voice = PiperVoice(embedded_voice_path())
    voice.warmup()
    return voice
