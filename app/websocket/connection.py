"""One ``/v1/tts/stream`` connection: what each client message does (``io.receive_loop`` brings them).

``start`` fixes the voice, rate and options of the utterances that follow; ``text`` feeds the open utterance
(opening one, an engine stream, at the first text); ``flush`` closes its input; ``cancel`` drops every
utterance and restarts the sender; ``end`` closes the input for good. The sender task (``sender.py``) sends
the audio; a disconnect drops every utterance, which cancels their streams at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from fastapi import WebSocket

from rtvoice.app.close_codes import CLOSE_GOING_AWAY, SHUTTING_DOWN
from rtvoice.app.errors import ShuttingDown
from rtvoice.app.request_context import track_stream
from rtvoice.app.websocket.io import Gone, SocketWriter, json_of, receive_loop
from rtvoice.app.websocket.messages import (
    CancelledEvent,
    Delivered,
    StartedEvent,
    StartMessage,
    TextMessage,
    message_type,
)
from rtvoice.app.websocket.sender import Sender
from rtvoice.app.websocket.utterances import Utterance, Utterances
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest


class Connection:
    def __init__(self, websocket: WebSocket, engine: Engine) -> None:
        self.ws = websocket
        self.engine = engine
        self.config: SynthesisRequest | None = None
        """What ``start`` set: every utterance's request, but for its text."""
        self.ending = False
        """The client sent ``end``."""
        self.unreadable = False
        """The utterance taking text was dropped because its markup does not read (the client got the error): the
        ``flush`` that ends it ends nothing more, and text after it opens a new utterance."""
        self.writer = SocketWriter(websocket)
        self.utterances = Utterances()
        self.sender = Sender(self.writer, self.utterances)

    async def run(self) -> None:
        self.sender.start()
        # An engine error answers the message that caused it with an ``error`` event; the session goes on.
        await receive_loop(self.ws, self._handle, self._release, on_error=self.sender.send_error)

    async def _release(self) -> None:
        """The client left (or the server closed the socket): free its work at once."""
        self.utterances.drop_all()
        await self.sender.stop()

    async def _handle(self, frame: dict[str, Any]) -> None:
        body = json_of(frame)
        kind = message_type(body)
        if kind == "start":
            await self._on_start(body)
        elif kind == "text":
            self._on_text(body)
        elif kind == "flush":
            self._on_flush()
        elif kind == "cancel":
            await self._on_cancel()
        else:
            self._on_end()

    # -- messages --------------------------------------------------------------------------------------

    def _check_open_for_input(self) -> None:
        if self.ending:
            raise InvalidRequest("the session has ended ('end' was sent); open a new connection", code="input_closed")

    async def _on_start(self, body: dict[str, Any]) -> None:
        self._check_open_for_input()
        start = StartMessage.parse(body)
        config = SynthesisRequest(
            voice=start.voice,
            options=SynthesisOptions(speed=start.speed, seed=start.seed),
            normalize=start.normalize,
            sample_rate=start.sample_rate,
            text_type=start.input_type,
            lexicons=tuple(start.lexicons),
            words=True,
        )
        voice = self.engine.validate(config)
        self.config = replace(config, voice=voice.id)
        rate = start.sample_rate or voice.sample_rate
        await self.sender.send_event(StartedEvent(voice=voice.id, sample_rate=rate, speed=start.speed, seed=start.seed))

    def _on_text(self, body: dict[str, Any]) -> None:
        self._check_open_for_input()
        if self.config is None:
            raise InvalidRequest("send 'start' before 'text'", code="not_started")
        fragment = TextMessage.parse(body).text
        if not fragment:
            return
        utterance = self.utterances.open or self._open_utterance()
        self.unreadable = False
        # input_too_long past the limit: this fragment is dropped; SSML that does not read: the utterance too.
        with self._unreadable_drops(utterance):
            try:
                utterance.stream.push_text(fragment)
            except InvalidRequest as error:
                self.unreadable = error.code == "invalid_ssml"
                raise
        utterance.mark_text()

    @contextmanager
    def _unreadable_drops(self, utterance: Utterance) -> Iterator[None]:
        """An utterance whose markup does not read is dropped (nothing more of it is spoken) and the error goes to
        the client; the connection lives on for the next."""
        try:
            yield
        except InvalidRequest as error:
            if error.code == "invalid_ssml":
                self.utterances.lost(utterance)
                self.utterances.drop(utterance)
            raise

    def _open_utterance(self) -> Utterance:
        assert self.config is not None
        stream = self.engine.open_stream(self.config)
        track_stream(stream)
        return self.utterances.begin(stream)

    def _on_flush(self) -> None:
        self._check_open_for_input()
        if self.config is None:
            raise InvalidRequest("send 'start' before 'flush'", code="not_started")
        utterance = self.utterances.open
        if utterance is None and self.unreadable:  # it ended with its error; this flush was its end
            self.unreadable = False
            return
        if utterance is None or not utterance.stream.speakable:
            if utterance is not None:
                self.utterances.drop(utterance)
            raise InvalidRequest(
                "nothing to speak: send text with letters or digits before 'flush'", code="empty_input"
            )
        with self._unreadable_drops(utterance):
            self.utterances.close_input(utterance)

    async def _on_cancel(self) -> None:
        stopped = self.utterances.live()
        self.utterances.drop_all()
        self.unreadable = False
        # Stop the sender where it is (at most the frame already written goes out), then start a fresh one.
        await self.sender.stop()
        if self.writer.closed:
            return
        self.sender.start()
        try:
            await self.sender.send_event(
                CancelledEvent(
                    utterances=[u.index for u in stopped],
                    delivered=[Delivered.of(u.index, u.words, u.samples / u.stream.sample_rate) for u in stopped],
                )
            )
        except Gone:
            pass

    def _on_end(self) -> None:
        self._check_open_for_input()
        self.ending = True
        utterance = self.utterances.open
        try:
            if utterance is not None:
                if utterance.stream.speakable:
                    with self._unreadable_drops(utterance):
                        self.utterances.close_input(utterance)
                else:
                    self.utterances.drop(utterance)
        finally:  # the session ends even when its last utterance does not read
            self.utterances.end()

    # -- the server's handle (``io.serve_session``) -----------------------------------------------------

    def speaking(self) -> bool:
        """An utterance is being spoken, queued, or taking text."""
        return bool(self.utterances.live()) or self.utterances.open is not None

    def owes_audio(self) -> bool:
        """An utterance the client flushed or ended is being spoken or queued."""
        return any(utterance is not self.utterances.open for utterance in self.utterances.live())

    async def shut_down(self) -> None:
        """The server's drain ran out: stop speaking, say ``server_shutting_down``, close 1001."""
        self.utterances.drop_all()
        await self.sender.stop()
        await self.sender.send_error(ShuttingDown())
        await self.writer.close(CLOSE_GOING_AWAY, SHUTTING_DOWN)
