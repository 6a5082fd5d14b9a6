"""The one wait helper: wait for a condition the server (or a client) reaches on its own (a freed slot, a closed
session, a frame received), with a deadline; never a fixed sleep. ``wait_for`` blocks; ``wait_for_async`` is the
same for code on an event loop, which must keep running while it waits."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

POLL_INTERVAL_S = 0.05


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = POLL_INTERVAL_S) -> bool:
    """True as soon as ``predicate()`` holds; False when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


async def wait_for_async(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, interval: float = POLL_INTERVAL_S
) -> bool:
    """``wait_for`` on an event loop: the loop runs (and can make the condition true) between checks; ``predicate``
    may be a coroutine function (a check that itself talks to the server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = predicate()
        if await held if inspect.isawaitable(held) else held:
            return True
        await asyncio.sleep(interval)
    return False
