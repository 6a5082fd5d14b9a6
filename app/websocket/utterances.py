"""A connection's utterances: each one engine stream, spoken in order.

The one taking text is ``open`` (until ``flush``); the ones waiting for the sender are ``queue``d in order
(with ``END`` after the last once the client sent ``end``); the one whose audio is going out is ``current``.
Dropping one (``cancel``, a disconnect, a ``flush`` with nothing to speak) cancels its stream at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from rtvoice.engine.stream import SpeechStream, WordTiming


@dataclass(eq=False)
class Utterance:
    index: int
    stream: SpeechStream
    text_at: float | None = None
    """When the text that completed its first segment (or its flush) arrived: where TTFA starts."""
    ttfa_s: float | None = None
    samples: int = 0
    words: list[WordTiming] = field(default_factory=list)
    """Words sent so far."""
    dropped: bool = False
    """Removed without a ``done`` (cancelled, or flushed with nothing to speak)."""

    def mark_text(self) -> None:
        if self.text_at is None and self.stream.segments:
            self.text_at = time.monotonic()


class EndOfSession:
    """Queued after the last utterance when the client sent ``end``."""


END = EndOfSession()


class Utterances:
    def __init__(self) -> None:
        self.open: Utterance | None = None
        """The utterance taking text (no flush yet)."""
        self.current: Utterance | None = None
        """The utterance whose audio the sender is sending."""
        self.queue: deque[Utterance | EndOfSession] = deque()
        """Utterances waiting for the sender, in order; ``END`` last once the client sent ``end``."""
        self._queued = asyncio.Event()
        self._next_index = 0

    def begin(self, stream: SpeechStream) -> Utterance:
        """A new utterance on ``stream``: open for text, and queued for the sender."""
        utterance = Utterance(self._next_index, stream)
        self._next_index += 1
        self.open = utterance
        self._append(utterance)
        return utterance

    def end(self) -> None:
        """The client sent ``end``: nothing follows what is queued."""
        self._append(END)

    def _append(self, item: Utterance | EndOfSession) -> None:
        self.queue.append(item)
        self._queued.set()

    async def next(self) -> Utterance | EndOfSession:
        """The next utterance for the sender (or ``END``), once there is one."""
        while not self.queue:
            self._queued.clear()
            await self._queued.wait()
        return self.queue.popleft()

    def end_is_next(self) -> bool:
        return bool(self.queue) and isinstance(self.queue[0], EndOfSession)

    def close_input(self, utterance: Utterance) -> None:
        """Its text is complete (``flush`` or ``end``): speak the rest."""
        utterance.stream.close_input()
        utterance.mark_text()
        if self.open is utterance:
            self.open = None

    def lost(self, utterance: Utterance) -> None:
        """Its stream failed: it takes no more text."""
        if self.open is utterance:
            self.open = None

    def live(self) -> list[Utterance]:
        """Being spoken or queued, in order, and not dropped."""
        live = [] if self.current is None else [self.current]
        live += [u for u in self.queue if isinstance(u, Utterance) and u is not self.current]
        return [u for u in live if not u.dropped]

    def drop(self, utterance: Utterance) -> None:
        utterance.dropped = True
        utterance.stream.cancel()
        if self.open is utterance:
            self.open = None
        try:
            self.queue.remove(utterance)
        except ValueError:
            pass  # the sender has it; it sees ``dropped`` and stops

    def drop_all(self) -> None:
        for utterance in self.live():
            self.drop(utterance)
        if self.open is not None:
            self.drop(self.open)
