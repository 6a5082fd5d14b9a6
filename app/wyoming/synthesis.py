"""One Wyoming request for speech and its answer: a ``synthesize`` (the whole text at once) or a streaming session
(``synthesize-start``, ``synthesize-chunk``s, ``synthesize-stop``). Each is one engine stream.

A ``synthesize`` opens its stream with its whole text. A streaming session checks its voice at its start, opens its
stream at its first chunk and pushes every chunk into it as it arrives (leading spaces kept: they join an LLM's
deltas), so speech starts as soon as the first segment is complete, below the sentence and long before the stop;
``synthesize-stop`` closes the stream's input.

The answer (``send``): ``audio-start``, ``audio-chunk``s (int16 mono at the stream's rate, the voice's own, each with
its ``timestamp`` in milliseconds of audio before it), ``audio-stop``; a streaming session's then ``synthesize-stopped``
once the client has sent its stop, so one format and one ``audio-start`` cover the whole stream. A request that fails
(its voice, its text, the engine at capacity, the synthesis) answers ``error`` ``{text, code}`` instead of the rest of
its audio; a streaming session still ends with ``synthesize-stopped``, after the stop, so a client waiting for it
does not hang. A session whose text had nothing to speak answers ``synthesize-stopped`` alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.tts import SynthesizeStopped

from rtvoice.app.request_context import RequestRecord
from rtvoice.app.wyoming.framing import EventWriter
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError
from rtvoice.engine.request import FieldNames, SynthesisRequest
from rtvoice.engine.stream import SpeechStream

log = logging.getLogger(__name__)

SAMPLE_WIDTH = 2
"""Bytes per sample: int16."""
CHANNELS = 1

NAMES = FieldNames(text="text", voice="voice.name")
"""Wyoming's names for a request's fields, in the errors about them."""

Kind = Literal["synthesize", "synthesize-start"]


class Synthesis:
    def __init__(self, kind: Kind, record: RequestRecord) -> None:
        self.kind: Kind = kind
        self.record = record
        self.request: SynthesisRequest | None = None
        """What the stream opens with (a streaming session's, without text); None once it failed before."""
        self.stream: SpeechStream | None = None
        self.error: EngineError | None = None
        self.input_closed = False
        """All its text is in: a ``synthesize``'s at once, a session's at its ``synthesize-stop``."""
        self.client_left = False
        self._changed = asyncio.Event()
        self.ended_at: float | None = None

    @property
    def streaming(self) -> bool:
        return self.kind == "synthesize-start"

    # -- the client's side (the connection's reader) --------------------------------------------------

    def open(self, engine: Engine, request: SynthesisRequest) -> None:
        """A ``synthesize``: its stream, with the whole text; a session: its voice checked, the stream opened at the
        first chunk. An engine error fails the request (the client gets it in turn)."""
        try:
            if request.text is not None:
                self._started(engine.open_stream(request))
                self.input_closed = True
            else:
                engine.validate(request)
                self.request = request
        except EngineError as error:
            self.fail(error)

    def push(self, engine: Engine, text: str) -> None:
        """A session's chunk: into its stream (opened now at the first). Nothing once the session failed."""
        if self.error is not None or self.input_closed or not text:
            return
        try:
            if self.stream is None:
                assert self.request is not None
                self._started(engine.open_stream(self.request))
            assert self.stream is not None
            self.stream.push_text(text)
        except EngineError as error:
            self.fail(error)

    def close_input(self) -> None:
        """A session's ``synthesize-stop``: speak the rest; a session with nothing to speak ends now."""
        if self.input_closed:
            return
        self.input_closed = True
        stream = self.stream
        if stream is not None and self.error is None:
            if stream.speakable:
                try:
                    stream.close_input()
                except EngineError as error:  # the last of its markup does not read
                    self.fail(error)
            else:
                stream.cancel()
        self._changed.set()

    def _started(self, stream: SpeechStream) -> None:
        self.stream = stream
        self.record.streams.append(stream)
        self._changed.set()

    def fail(self, error: EngineError) -> None:
        """The request cannot be spoken (further): its stream stops; the client gets ``error``."""
        if self.error is None:
            self.error = error
        if self.stream is not None:
            self.stream.cancel()
        self._changed.set()

    def drop(self) -> None:
        """The client left, or the server shuts down: free the stream now."""
        self.client_left = True
        if self.stream is not None:
            self.stream.cancel()
        self._changed.set()

    @property
    def in_progress(self) -> bool:
        """It has speech still to send (a drain waits for it)."""
        return self.ended_at is None

    # -- the answer (the connection's sender) ------------------------------------------------------------

    async def _stream_or_end(self) -> SpeechStream | None:
        """Its stream once it has one; None when it ended without one (failed, or a session with no text)."""
        while self.stream is None and self.error is None and not self.input_closed:
            self._changed.clear()
            await self._changed.wait()
        return self.stream

    async def _input_end(self) -> None:
        while not self.input_closed:
            self._changed.clear()
            await self._changed.wait()

    async def send(self, writer: EventWriter) -> None:
        """The answer, as the module says; raises framing.Gone when the client left."""
        stream = await self._stream_or_end()
        if stream is not None:
            rate = stream.sample_rate
            await writer.write(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=CHANNELS, timestamp=0).event())
            samples = 0
            try:
                async for pcm in stream.audio():
                    audio = pcm.astype("<i2", copy=False).tobytes()
                    chunk = AudioChunk(
                        rate=rate,
                        width=SAMPLE_WIDTH,
                        channels=CHANNELS,
                        audio=audio,
                        timestamp=samples * 1000 // rate,
                    )
                    await writer.write(chunk.event())
                    samples += len(pcm)
            except EngineError as error:  # the synthesis failed
                self.fail(error)
            finally:
                stream.cancel()  # the client left mid-write: free the stream now
            if self.error is None:
                await writer.write(AudioStop(timestamp=samples * 1000 // rate).event())
        if self.error is not None:
            await writer.write(Error(text=self.error.message, code=self.error.code).event())
        if self.streaming:
            await self._input_end()
            await writer.write(SynthesizeStopped().event())

    def status(self) -> str:
        """Its outcome, for the metrics and the access line: ``ok``, the error's code, or ``cancelled``."""
        if self.error is not None:
            return self.error.code
        if self.client_left:
            return "cancelled"
        return "ok"

    def ended(self) -> None:
        if self.ended_at is None:
            self.ended_at = time.monotonic()
