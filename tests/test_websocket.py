"""The WebSocket protocol (/v1/tts/stream) over a real socket: streamed text, utterances, barge-in, errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import websockets

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.stream import AudioChunk, SegmentDone
from rtvoice.engine.text import Segmenter
from testkit.polling import wait_for
from tests.audio import same_speech
from tests.conftest import Server, settled_audio_seconds
from tests.engine_output import EMBEDDED_VOICE_RATE, reference_engine

SENTENCE = "This sentence comes from rtvoice, streaming as it speaks."
LONG_TEXT = " ".join(
    [
        "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone expected a",
        "short meeting, but the discussion about the new budget, the delayed construction of the bridge, and the",
        "future of the community garden went on for hours.",
    ]
    * 4
)
NATIVE_RATE = EMBEDDED_VOICE_RATE


# -- what the engine makes of the same text, in-process ------------------------------------------------------


@dataclass
class Job:
    parts: list[str]
    """Pushed in turn; before each next part, every segment so far has finished (as the socket tests wait)."""
    seed: int
    sample_rate: int | None = None


def engine_pcm(jobs: list[Job]) -> list[np.ndarray]:
    """int16 samples the engine streams for each job (one engine for all of them)."""

    async def run() -> list[np.ndarray]:
        engine = reference_engine()
        await engine.start()
        try:
            results = []
            for job in jobs:
                stream = engine.open_stream(
                    SynthesisRequest(options=SynthesisOptions(seed=job.seed), sample_rate=job.sample_rate)
                )
                events = stream.events()
                chunks: list[np.ndarray] = []
                done = 0
                for i, part in enumerate(job.parts):
                    stream.push_text(part)
                    if i == len(job.parts) - 1:
                        break
                    while done < len(stream.segments):
                        event = await events.__anext__()
                        if isinstance(event, SegmentDone):
                            done += 1
                        elif isinstance(event, AudioChunk):
                            chunks.append(event.pcm)
                stream.close_input()
                async for event in events:
                    if isinstance(event, AudioChunk):
                        chunks.append(event.pcm)
                results.append(np.concatenate(chunks))
            return results
        finally:
            await engine.stop()

    return asyncio.run(run())


# -- a small client --------------------------------------------------------------------------------------------


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/tts/stream"


def fragments(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class Utterance:
    events: list[dict[str, Any]] = field(default_factory=list)
    pcm: bytearray = field(default_factory=bytearray)
    """Binary frames in order; ``order`` marks where the events fell among them."""
    order: list[str] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    """Each binary frame's size in bytes."""

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(bytes(self.pcm), dtype="<i2")

    def event(self, kind: str) -> dict[str, Any]:
        return next(e for e in self.events if e["type"] == kind)


class Client:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, **message: Any) -> None:
        await self.ws.send(json.dumps(message))

    async def text(self, text: str, size: int = 4) -> None:
        for piece in fragments(text, size):
            await self.send(type="text", text=piece)

    async def recv(self, timeout: float = 30) -> dict[str, Any] | bytes:
        message = await asyncio.wait_for(self.ws.recv(), timeout)
        return message if isinstance(message, bytes) else json.loads(message)

    async def event(self, timeout: float = 30) -> dict[str, Any]:
        message = await self.recv(timeout)
        assert isinstance(message, dict), "expected an event, got audio"
        return message

    async def start(self, **fields: Any) -> dict[str, Any]:
        await self.send(type="start", **fields)
        started = await self.event()
        assert started["type"] == "started", started
        return started

    async def utterance(
        self, until: Callable[[dict[str, Any]], bool] | None = None, into: Utterance | None = None
    ) -> Utterance:
        """Audio and events up to the utterance's ``done`` (or until ``until`` says stop)."""
        result = into or Utterance()
        while True:
            message = await self.recv()
            if isinstance(message, bytes):
                result.pcm += message
                result.order.append("audio")
                result.chunks.append(len(message))
                continue
            result.events.append(message)
            result.order.append(message["type"])
            if until is not None and until(message):
                return result
            if message["type"] in ("done", "error", "cancelled"):
                return result

    async def silent_for(self, seconds: float) -> bool:
        """True when nothing arrives for ``seconds``."""
        try:
            await asyncio.wait_for(self.ws.recv(), seconds)
        except TimeoutError:
            return True
        return False


def session(server: Server, body: Callable[[Client], Any]) -> Any:
    async def run() -> Any:
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            return await body(Client(ws))

    return asyncio.run(run())


@pytest.fixture(scope="module")
def small_server(start_server: Callable[..., Server]) -> Server:
    """One synthesis slot, no queue, short utterances: overload and length limits."""
    return start_server(max_active_streams="1", max_queued_streams="0", max_text_chars="200", warmup="false")


# -- streaming text ------------------------------------------------------------------------------------------


def test_fragments_speak_at_sentence_ends_and_match_the_engine(server: Server) -> None:
    first, rest = "Hello there. Th", "is sentence comes from rtvoice, streaming as it speaks."

    async def body(client: Client) -> tuple[Utterance, Utterance]:
        started = await client.start(seed=7)
        assert started["sample_rate"] == NATIVE_RATE and started["voice"] == "en_US-joe-medium"
        await client.text(first)
        # No flush and no end yet: the finished sentence is spoken on its own.
        head = await client.utterance(until=lambda e: e["type"] == "segment_done")
        await client.text(rest)
        await client.send(type="flush")
        tail = await client.utterance()
        return head, tail

    head, tail = session(server, body)
    assert head.order[0] == "audio_start" and head.order[1] == "word" and head.order[-1] == "segment_done"
    assert "audio" in head.order
    start = head.event("audio_start")
    assert start["utterance"] == 0 and start["sample_rate"] == NATIVE_RATE and start["encoding"] == "pcm_s16le"
    assert 0 <= start["ttfa_ms"] < 5000
    assert head.event("segment_done") == {"type": "segment_done", "utterance": 0, "index": 0, "text": "Hello there."}
    assert [e["text"] for e in tail.events if e["type"] == "segment_done"] == [SENTENCE]
    done = tail.event("done")
    audio = np.concatenate([head.samples, tail.samples])
    assert done["utterance"] == 0 and done["final"] is False and done["segments"] == 2
    assert done["audio_s"] == pytest.approx(len(audio) / NATIVE_RATE, abs=1e-3)
    assert done["text_chars"] == len(first + rest) and done["ttfa_ms"] == start["ttfa_ms"]
    (expected,) = engine_pcm([Job([first, rest], seed=7)])
    assert same_speech(audio, expected)


def test_many_utterances_on_one_connection_then_end(server: Server) -> None:
    texts = ["Good morning.", SENTENCE, "See you soon"]

    async def body(client: Client) -> tuple[list[Utterance], int | None]:
        await client.start(seed=3)
        # The second utterance is sent while the first still speaks: it is spoken after it, in order.
        await client.text(texts[0])
        await client.send(type="flush")
        await client.text(texts[1], size=3)
        await client.send(type="flush")
        utterances = [await client.utterance(), await client.utterance()]
        await client.text(texts[2])
        await client.send(type="end")
        utterances.append(await client.utterance())
        with pytest.raises(websockets.ConnectionClosedOK):
            await client.recv()
        return utterances, client.ws.close_code

    utterances, close_code = session(server, body)
    assert close_code == 1000
    expected = engine_pcm([Job([text], seed=3) for text in texts])
    for index, (utterance, want) in enumerate(zip(utterances, expected, strict=True)):
        assert utterance.order[0] == "audio_start" and utterance.order[-1] == "done"
        done = utterance.event("done")
        segmenter = Segmenter.of(EngineSettings())
        segments = segmenter.push(texts[index]) + segmenter.flush()
        assert done["utterance"] == index and done["segments"] == len(segments)
        assert done["final"] is (index == 2)
        assert same_speech(utterance.samples, want), f"utterance {index}"
    final = utterances[2].event("done")
    assert final["session"]["utterances"] == 3
    assert final["session"]["audio_s"] == pytest.approx(sum(len(e) for e in expected) / NATIVE_RATE, abs=1e-3)


def test_flush_speaks_a_trailing_fragment(server: Server) -> None:
    text = "So this is where the sentence trails off"

    async def body(client: Client) -> tuple[bool, Utterance, dict[str, Any]]:
        await client.start(seed=5)
        await client.text(text)
        quiet = await client.silent_for(0.3)  # no sentence end: nothing is spoken yet
        await client.send(type="flush")
        utterance = await client.utterance()
        await client.send(type="flush")  # nothing left to flush
        return quiet, utterance, await client.event()

    quiet, utterance, error = session(server, body)
    assert quiet
    (expected,) = engine_pcm([Job([text], seed=5)])
    assert same_speech(utterance.samples, expected)
    assert error["type"] == "error" and error["code"] == "empty_input"


def test_end_with_nothing_to_say_closes_normally(server: Server) -> None:
    async def body(client: Client) -> tuple[dict[str, Any], int | None]:
        await client.start()
        await client.send(type="end")
        done = await client.event()
        with pytest.raises(websockets.ConnectionClosedOK):
            await client.recv()
        return done, client.ws.close_code

    done, code = session(server, body)
    assert done["type"] == "done" and done["final"] is True and done["utterance"] is None
    assert done["session"] == {"utterances": 0, "audio_s": 0.0} and code == 1000


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
def test_resampled_rates(server: Server, rate: int) -> None:
    async def body(client: Client) -> tuple[dict[str, Any], Utterance]:
        started = await client.start(seed=9, sample_rate=rate)
        await client.text(SENTENCE)
        await client.send(type="flush")
        return started, await client.utterance()

    started, utterance = session(server, body)
    assert started["sample_rate"] == rate and utterance.event("audio_start")["sample_rate"] == rate
    native, resampled = engine_pcm([Job([SENTENCE], seed=9), Job([SENTENCE], seed=9, sample_rate=rate)])
    assert abs(len(utterance.samples) / rate - len(native) / NATIVE_RATE) < 0.01
    assert same_speech(utterance.samples, resampled)
    assert utterance.event("done")["audio_s"] == pytest.approx(len(resampled) / rate, abs=1e-3)


def test_words_come_before_their_audio_with_spans_in_the_text_sent(server: Server) -> None:
    """Text token by token: each word's span points into the concatenated fragments ("$100" stays "$100"), and
    each ``word`` event comes no later than the frame that holds its start."""
    text = "It costs $100, Dr. Smith said. Then we left."

    async def body(client: Client) -> Utterance:
        await client.start(seed=3, sample_rate=16000)
        await client.text(text, size=3)
        await client.send(type="flush")
        return await client.utterance()

    utterance = session(server, body)
    words = [e for e in utterance.events if e["type"] == "word"]
    assert [w["text"] for w in words] == ["It", "costs", "$100", "Dr.", "Smith", "said", "Then", "we", "left"]
    assert all(text[w["char_start"] : w["char_end"]] == w["text"] and w["utterance"] == 0 for w in words)
    assert all(w["approximate"] is False for w in words)
    audio_s = len(utterance.samples) / 16000
    starts = [w["start_s"] for w in words]
    assert starts == sorted(starts) and all(w["start_s"] < w["end_s"] <= audio_s + 0.002 for w in words)
    # Replay the order: when a word arrives, the audio before it ends no later than the word's start.
    received_s = 0.0
    chunks = iter(utterance.chunks)
    for kind in utterance.order:
        if kind == "audio":
            received_s += next(chunks) / 2 / 16000
        elif kind == "word":
            word = words.pop(0)
            assert received_s <= word["start_s"] + 1e-6, word


# -- barge-in and leaving --------------------------------------------------------------------------------------


def test_cancel_stops_audio_within_a_chunk_and_new_text_works(server: Server) -> None:
    words: list[dict[str, Any]] = []
    received_s = 0.0

    async def body(client: Client) -> tuple[int, float, dict[str, Any], bool, float, Utterance]:
        nonlocal received_s
        await client.start(seed=1)
        await client.send(type="text", text=LONG_TEXT)  # ~55 s of speech, synthesised far ahead of real time
        frames = 0
        while frames < 2:
            message = await client.recv()
            if isinstance(message, bytes):
                frames += 1
                received_s += len(message) / 2 / NATIVE_RATE
            elif message["type"] == "word":
                words.append(message)
        await client.send(type="cancel")
        after, after_s = 0, 0.0
        while True:
            message = await client.recv()
            if isinstance(message, bytes):
                after += 1
                after_s += len(message) / 2 / NATIVE_RATE
                continue
            if message["type"] == "cancelled":
                cancelled = message
                break
            assert message["type"] in ("segment_done", "word"), message  # no done for a cancelled utterance
            if message["type"] == "word":
                words.append(message)
        quiet = await client.silent_for(0.5)
        active = server.metric("rtvoice_active_streams")
        await client.text("Good morning.")
        await client.send(type="flush")
        return after, after_s, cancelled, quiet, active, await client.utterance()

    after, after_s, cancelled, quiet, active, utterance = session(server, body)
    # The server sends nothing once it has read the cancel; what it sent before may still arrive: a chunk or two,
    # or a few more where a loaded machine left them unread in the client's buffer (of some 55 s of speech).
    assert after_s < 4.0, (after, after_s)
    assert cancelled["type"] == "cancelled" and cancelled["utterances"] == [0]
    (reached,) = cancelled["delivered"]
    assert reached["utterance"] == 0 and 0 < reached["audio_s"] < 10
    # The audio it says it sent is what arrived, and its last word is the last whole one in it.
    assert reached["audio_s"] == pytest.approx(received_s + after_s, abs=1e-3)
    whole = [w for w in words if w["end_s"] <= reached["audio_s"]]
    assert whole and reached["last_word"] == {k: v for k, v in whole[-1].items() if k not in ("type", "utterance")}
    assert all(w["end_s"] > reached["audio_s"] for w in words[len(whole) :])
    assert quiet and active == 0
    done = utterance.event("done")
    assert done["utterance"] == 1 and done["final"] is False
    (expected,) = engine_pcm([Job(["Good morning."], seed=1)])
    assert same_speech(utterance.samples, expected)


def test_cancel_after_end_stops_and_closes(server: Server) -> None:
    async def body(client: Client) -> tuple[list[dict[str, Any]], int | None]:
        await client.start()
        await client.send(type="text", text=LONG_TEXT)
        await client.send(type="end")
        await client.send(type="text", text="One more thing.")  # too late: the input is closed
        events = []
        while not any(e["type"] == "error" for e in events):
            message = await client.recv()
            if isinstance(message, dict):
                events.append(message)
        await client.send(type="cancel")
        while events[-1]["type"] != "done":
            message = await client.recv()
            if isinstance(message, dict):
                events.append(message)
        with pytest.raises(websockets.ConnectionClosedOK):
            await client.recv()
        return events, client.ws.close_code

    events, code = session(server, body)
    error = next(e for e in events if e["type"] == "error")
    assert error["code"] == "input_closed"
    cancelled = next(e for e in events if e["type"] == "cancelled")
    assert cancelled["utterances"] == [0]
    done = events[-1]
    assert done["utterance"] is None and done["final"] is True and code == 1000


@pytest.mark.parametrize("how", ["close", "abort"])
def test_disconnect_mid_speech_frees_the_stream(server: Server, how: str) -> None:
    cancelled_before = server.metric("rtvoice_streams_total", {"outcome": "cancelled"})
    audio_before = server.metric("rtvoice_audio_seconds_total")

    async def body(client: Client) -> None:
        await client.start()
        await client.send(type="text", text=LONG_TEXT * 2)
        while not isinstance(await client.recv(), bytes):
            pass
        assert server.metric("rtvoice_active_streams") >= 1
        if how == "abort":
            client.ws.transport.abort()  # no closing handshake: the TCP connection just drops
        else:
            await client.ws.close()

    session(server, body)
    assert wait_for(lambda: server.metric("rtvoice_active_streams") == 0)
    assert server.metric("rtvoice_streams_total", {"outcome": "cancelled"}) == cancelled_before + 1
    assert settled_audio_seconds(server) - audio_before < 60  # of ~110 s in the text


# -- errors ----------------------------------------------------------------------------------------------------


def test_bad_messages_get_error_events_and_the_connection_stays_usable(server: Server) -> None:
    async def body(client: Client) -> tuple[list[dict[str, Any]], Utterance]:
        errors = []

        async def expect_error(raw: str | bytes) -> None:
            await client.ws.send(raw)
            errors.append(await client.event())

        await expect_error("{not json")
        await expect_error("[1, 2]")
        await expect_error(json.dumps({"type": "sing"}))
        await expect_error(b"\x00\x01")
        await expect_error(json.dumps({"type": "text", "text": "Hello."}))  # before start
        await expect_error(json.dumps({"type": "flush"}))  # before start
        await expect_error(json.dumps({"type": "start", "voice": "nobody"}))
        await expect_error(json.dumps({"type": "start", "sample_rate": 12345}))
        await expect_error(json.dumps({"type": "start", "encoding": "mp3"}))
        await expect_error(json.dumps({"type": "start", "speed": 9}))
        await client.start(seed=2)
        await expect_error(json.dumps({"type": "text"}))
        await expect_error(json.dumps({"type": "flush"}))  # nothing to flush
        await expect_error(json.dumps({"type": "text", "text": "x" * 4097}))
        await client.text("?!...")
        await expect_error(json.dumps({"type": "flush"}))  # nothing speakable
        await client.text("Good morning.")
        await client.send(type="flush")
        return errors, await client.utterance()

    errors, utterance = session(server, body)
    assert all(e["type"] == "error" and e["message"] for e in errors)
    assert [(e["code"], e["param"]) for e in errors] == [
        ("invalid_json", None),
        ("invalid_message", "type"),
        ("unknown_type", "type"),
        ("invalid_message", None),
        ("not_started", None),
        ("not_started", None),
        ("voice_not_found", "voice"),
        ("unsupported_sample_rate", "sample_rate"),
        ("unsupported_encoding", "encoding"),
        ("invalid_value", "speed"),
        ("invalid_message", "text"),
        ("empty_input", None),
        ("input_too_long", "text"),
        ("empty_input", None),
    ]
    assert "en_US-joe-medium" in errors[6]["message"]  # the valid voices are listed
    assert "start, text, flush, cancel, end" in errors[2]["message"]
    done = utterance.event("done")
    assert done["utterance"] == 1 and done["segments"] == 1  # utterance 0 was the unspeakable one
    (expected,) = engine_pcm([Job(["Good morning."], seed=2)])
    assert same_speech(utterance.samples, expected)


def test_text_over_the_limit_is_refused_per_utterance(small_server: Server) -> None:
    async def body(client: Client) -> tuple[dict[str, Any], Utterance, Utterance]:
        await client.start(seed=4)
        await client.text("Counting the characters of one utterance. " * 4, size=50)  # 168 of 200
        await client.send(type="text", text="This fragment is one too many, far too many.")
        # Its sentences are already speaking; the error comes among their audio.
        first = await client.utterance(until=lambda e: e["type"] == "error")
        error = first.events.pop()
        await client.send(type="flush")
        await client.utterance(into=first)
        # The next utterance starts from zero again.
        await client.text("Counting the characters of one utterance. " * 4, size=50)
        await client.send(type="flush")
        return error, first, await client.utterance()

    error, first, second = session(small_server, body)
    assert error["code"] == "input_too_long" and error["param"] == "text" and "200" in error["message"]
    for index, utterance in enumerate([first, second]):
        done = utterance.event("done")
        assert done["utterance"] == index and done["text_chars"] == 168 and done["segments"] == 4


def test_over_capacity_gives_an_overloaded_event(small_server: Server) -> None:
    async def body() -> tuple[dict[str, Any], Utterance, Utterance]:
        url = ws_url(small_server)
        async with websockets.connect(url) as ws_a, websockets.connect(url) as ws_b:
            a, b = Client(ws_a), Client(ws_b)
            await a.start(seed=1)
            await b.start(seed=1)
            await a.text("This utterance holds the only slot")  # open: no flush yet
            assert wait_for(lambda: small_server.metric("rtvoice_active_streams") == 1)
            await b.send(type="text", text="Good morning.")
            overloaded = await b.event()
            await a.send(type="flush")
            spoken_a = await a.utterance()
            assert wait_for(lambda: small_server.metric("rtvoice_active_streams") == 0)
            # Capacity is back: the same connection gets its speech.
            await b.send(type="text", text="Good morning.")
            await b.send(type="flush")
            return overloaded, spoken_a, await b.utterance()

    overloaded, spoken_a, spoken_b = asyncio.run(body())
    assert overloaded["type"] == "error" and overloaded["code"] == "overloaded"
    assert overloaded["retry_after_s"] >= 1 and overloaded["message"]
    assert spoken_a.event("done")["segments"] == 1
    done = spoken_b.event("done")
    assert done["utterance"] == 0 and done["segments"] == 1  # the refused text opened no utterance
    (expected,) = engine_pcm([Job(["Good morning."], seed=1)])
    assert same_speech(spoken_b.samples, expected)
    assert small_server.metric("rtvoice_rejected_streams_total") >= 1
