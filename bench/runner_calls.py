"""Every model call of an in-process engine, timed on its runner thread: for the benches that look between calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import StepPayload, Voice
from rtvoice.engine.runner import BatchOutput


@dataclass(frozen=True)
class Call:
    kind: str
    """The step's kind (``encode``, ``flow``, ``decode``, ...)."""
    start: float
    end: float
    """``time.perf_counter()`` on the runner thread as the call began and ended."""


def timed_calls(engine: Engine) -> list[Call]:
    """The list that ``engine``'s runner appends each call to from now on (clear it between measurements)."""
    calls: list[Call] = []
    lock = threading.Lock()
    run_now = engine.runner.run_now

    def timed(voice: Voice, payloads: Sequence[StepPayload], wide: bool = False) -> BatchOutput:
        start = time.perf_counter()
        output = run_now(voice, payloads, wide)
        with lock:
            calls.append(Call(payloads[0].kind, start, time.perf_counter()))
        return output

    runner: Any = engine.runner  # the runner's call goes through its instance attribute: timed on the thread
    runner.run_now = timed
    return calls
