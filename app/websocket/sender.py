"""The sender task of a ``/v1/tts/stream`` connection, and the events the connection sends.

One task per connection sends the queued utterances in order: each one's audio as binary frames, its words
(each just before the frame that holds its start), its segment ends, then its ``done``. The receive loop runs
beside it, so a ``cancel`` is read while audio streams; it stops this task (at most the frame already on its way
follows) and starts a fresh one. Every frame goes through the connection's ``SocketWriter``, so frames never
interleave.
"""

from __future__ import annotations

import asyncio
import logging
import time

from rtvoice.app.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL_ERROR, CLOSE_NORMAL, INTERNAL_ERROR, SHUTTING_DOWN
from rtvoice.app.errors import ShuttingDown
from rtvoice.app.websocket.io import Gone, SocketWriter
from rtvoice.app.websocket.messages import (
    AudioStartEvent,
    DoneEvent,
    ErrorEvent,
    MarkEvent,
    SegmentDoneEvent,
    ServerEvent,
    SessionTotals,
    WordEvent,
)
from rtvoice.app.websocket.utterances import EndOfSession, Utterance, Utterances
from rtvoice.engine.errors import EngineError
from rtvoice.engine.stream import AudioChunk, MarkTiming, SegmentDone, StreamState, WordTiming

log = logging.getLogger(__name__)


class Sender:
    def __init__(self, writer: SocketWriter, utterances: Utterances) -> None:
        self.writer = writer
        self.utterances = utterances
        self.total_audio_s = 0.0
        self.utterances_done = 0
        self.previous_end = 0.0
        """When the previous utterance finished sending (monotonic)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rtvoice-ws-sender")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])

    # -- events -----------------------------------------------------------------------------------

    async def send_event(self, event: ServerEvent) -> None:
        await self.writer.send_json(event.wire())

    async def send_error(self, error: EngineError, utterance: int | None = None) -> None:
        try:
            await self.send_event(ErrorEvent.of(error, utterance))
        except Gone:
            pass  # the receive loop sees the disconnect next

    # -- the task ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        utterances = self.utterances
        try:
            while True:
                item = await utterances.next()
                if isinstance(item, EndOfSession):
                    await self._finish(None)
                    return
                utterances.current = item
                try:
                    ok = await self._speak(item)
                finally:
                    utterances.current = None
                    self.previous_end = time.monotonic()
                if ok:
                    final = utterances.end_is_next()
                    await self._finish(item, final)
                    if final:
                        return
        except Gone:
            utterances.drop_all()
        except Exception:
            log.exception("websocket sender failed")
            utterances.drop_all()
            await self.writer.close(CLOSE_INTERNAL_ERROR, INTERNAL_ERROR)

    async def _speak(self, utterance: Utterance) -> bool:
        """Send one utterance's audio and segment ends; False when it ended without a ``done``."""
        stream = utterance.stream
        try:
            async for event in stream.events():
                if utterance.dropped:
                    return False
                if isinstance(event, (AudioChunk, WordTiming)) and utterance.ttfa_s is None:
                    # From the text that made its first segment (or its flush), or from the end of the utterance
                    # it waited behind, whichever is later. The first audio's words come with it, after this.
                    now = time.monotonic()
                    utterance.ttfa_s = now - max(utterance.text_at or now, self.previous_end)
                    await self.send_event(
                        AudioStartEvent(
                            utterance=utterance.index,
                            sample_rate=stream.sample_rate,
                            ttfa_ms=round(utterance.ttfa_s * 1000, 1),
                        )
                    )
                if isinstance(event, AudioChunk):
                    await self.writer.send(data=event.pcm.astype("<i2", copy=False).tobytes())
                    utterance.samples += len(event.pcm)
                elif isinstance(event, WordTiming):
                    await self.send_event(WordEvent.of(event, utterance.index))
                    utterance.words.append(event)
                elif isinstance(event, MarkTiming):
                    await self.send_event(MarkEvent.of(event, utterance.index))
                elif isinstance(event, SegmentDone):
                    await self.send_event(
                        SegmentDoneEvent(utterance=utterance.index, index=event.index, text=event.text)
                    )
        except EngineError as error:  # StreamFailed: this utterance is lost, the connection is not
            self.utterances.lost(utterance)
            await self.send_error(error, utterance=utterance.index)
            return False
        if utterance.dropped:
            return False
        if stream.state is StreamState.CANCELLED:
            # Not by the client (that sets ``dropped``): the server is shutting down.
            await self.send_error(ShuttingDown(), utterance=utterance.index)
            await self.writer.close(CLOSE_GOING_AWAY, SHUTTING_DOWN)
            raise Gone
        return True

    async def _finish(self, utterance: Utterance | None, final: bool = True) -> None:
        """``done`` for an utterance (or for ``end`` with nothing left to speak); closes after the final one."""
        if utterance is not None:
            stats = utterance.stream.stats()
            audio_s = utterance.samples / utterance.stream.sample_rate
            self.total_audio_s += audio_s
            self.utterances_done += 1
            done = DoneEvent(
                utterance=utterance.index,
                final=final,
                audio_s=round(audio_s, 4),
                segments=stats.segments,
                text_chars=len(utterance.stream.text),
                ttfa_ms=None if utterance.ttfa_s is None else round(utterance.ttfa_s * 1000, 1),
                compute_s=round(stats.compute_s, 4),
                late_chunks=stats.late_chunks,
                ignored=list(utterance.stream.ignored) or None,
            )
        else:
            done = DoneEvent(utterance=None, final=final, audio_s=0.0, segments=0, text_chars=0, ttfa_ms=None)
        if final:
            done.session = SessionTotals(utterances=self.utterances_done, audio_s=round(self.total_audio_s, 4))
        await self.send_event(done)
        if final:
            await self.writer.close(CLOSE_NORMAL)
