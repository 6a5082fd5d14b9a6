"""Cartesia's TTS API (/tts/websocket, /tts/bytes) over real sockets: contexts, continuations, flush, cancel,
formats, voices, errors. The agent frameworks' own Cartesia clients are in test_agent_frameworks.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import defaultdict
from typing import Any

import httpx
import numpy as np
import pytest
import websockets

from testkit.polling import wait_for
from tests.audio import decode, parse_wav, same_speech
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

CARTESIA_VOICE = "a0e99841-438c-4a64-b679-ae501e7d6091"
"""A voice id of Cartesia's own: it names no rtvoice voice."""
FIRST = "Contexts share one socket and keep their own audio."
SECOND = "A second context speaks at another rate."
LONG = " ".join(["The meeting went on for hours, and nobody could say when it would end."] * 12)


def request(
    context_id: str,
    transcript: str,
    *,
    rate: int = EMBEDDED_VOICE_RATE,
    encoding: str = "pcm_s16le",
    voice: str = CARTESIA_VOICE,
    **fields: Any,
) -> dict[str, Any]:
    """A generation request as Pipecat's and LiveKit's Cartesia services send it."""
    return {
        "model_id": "sonic-3",
        "transcript": transcript,
        "voice": {"mode": "id", "id": voice},
        "output_format": {"container": "raw", "encoding": encoding, "sample_rate": rate},
        "language": "en",
        "context_id": context_id,
        "add_timestamps": True,
        "continue": True,
        **fields,
    }


class Client:
    """A raw Cartesia WebSocket client: JSON out, every message in, grouped by context."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.messages: list[dict[str, Any]] = []

    async def send(self, payload: dict[str, Any]) -> float:
        await self.ws.send(json.dumps(payload))
        return time.monotonic()

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        message["received_at"] = time.monotonic()
        self.messages.append(message)
        return message

    async def until_done(self, *context_ids: str) -> dict[str, list[dict[str, Any]]]:
        """Messages per context until each of ``context_ids`` has its ``done`` (or an error)."""
        pending = set(context_ids)
        by_context: dict[str, list[dict[str, Any]]] = defaultdict(list)
        while pending:
            message = await self.receive()
            by_context[message["context_id"]].append(message)
            if message["type"] in ("done", "error"):
                pending.discard(message["context_id"])
        return by_context


def connect(server: Server, query: str = "?api_key=sk-test&cartesia_version=2025-04-16") -> Any:
    return websockets.connect(
        f"{server.url.replace('http://', 'ws://')}/tts/websocket{query}",
        max_size=None,
        additional_headers={"X-API-Key": "sk-test", "Cartesia-Version": "2026-03-01"},
    )


def pcm_of(messages: list[dict[str, Any]], dtype: str = "<i2") -> np.ndarray:
    return np.frombuffer(b"".join(base64.b64decode(m["data"]) for m in messages if m["type"] == "chunk"), dtype=dtype)


def test_contexts_on_one_socket_match_the_engine(server: Server) -> None:
    """Two contexts at once, text in fragments (continuations): each one's audio is the engine's for its text."""

    async def run() -> dict[str, list[dict[str, Any]]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("a", FIRST[:20], seed=5))
            await client.send(request("b", SECOND[:9], rate=16000, seed=6))
            await client.send(request("a", FIRST[20:], seed=5))
            await client.send(request("b", SECOND[9:], rate=16000, seed=6, **{"continue": False}))
            await client.send(request("a", "", seed=5, **{"continue": False}))
            return await client.until_done("a", "b")

    by_context = asyncio.run(run())
    for context_id, text, seed, rate in (("a", FIRST, 5, EMBEDDED_VOICE_RATE), ("b", SECOND, 6, 16000)):
        messages = by_context[context_id]
        kinds = {m["type"] for m in messages}
        assert [m["type"] for m in messages][-1] == "done" and kinds == {"chunk", "timestamps", "done"}
        assert all(m["status_code"] == 206 and m["done"] is (m["type"] == "done") for m in messages)
        assert same_speech(pcm_of(messages), synthesize(text, seed=seed, sample_rate=rate)), context_id
        assert words_of(messages)[0] == text.split()  # continuations: the words of all the context's text


def words_of(messages: list[dict[str, Any]]) -> tuple[list[str], list[float], list[float]]:
    """A context's word timestamps, all its ``timestamps`` messages joined."""
    words: list[str] = []
    starts: list[float] = []
    ends: list[float] = []
    for message in messages:
        if message["type"] == "timestamps":
            timestamps = message["word_timestamps"]
            words += timestamps["words"]
            starts += timestamps["start"]
            ends += timestamps["end"]
    return words, starts, ends


def test_add_timestamps_sends_each_word_before_the_chunk_that_holds_it(server: Server) -> None:
    """Words as the client wrote them (punctuation, "$100"), in seconds of the context's audio, cumulative across
    its transcripts; a context without add_timestamps gets none."""
    text = "It costs $100, Dr. Smith said. Then we left."

    async def run() -> dict[str, list[dict[str, Any]]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("t", text[:17], rate=16000, seed=4))
            await client.send(request("t", text[17:], rate=16000, seed=4, **{"continue": False}))
            await client.send(request("n", "No words here.", add_timestamps=False, **{"continue": False}))
            return await client.until_done("t", "n")

    by_context = asyncio.run(run())
    messages = by_context["t"]
    words, starts, ends = words_of(messages)
    assert words == ["It", "costs", "$100,", "Dr.", "Smith", "said.", "Then", "we", "left."]
    audio_s = len(pcm_of(messages)) / 16000
    assert starts == sorted(starts) and all(s < e <= audio_s + 0.002 for s, e in zip(starts, ends, strict=True))
    assert starts[6] > audio_s / 2  # the second sentence's words count from the context's start
    sent_s = 0.0
    for message in messages:
        if message["type"] == "chunk":
            sent_s += len(base64.b64decode(message["data"])) / 2 / 16000
        elif message["type"] == "timestamps":
            assert message["done"] is False and message["status_code"] == 206
            assert all(sent_s <= start + 1e-6 for start in message["word_timestamps"]["start"])
            following = messages[messages.index(message) + 1]
            assert following["type"] == "chunk"  # each batch of words goes just before the chunk holding them
    assert {m["type"] for m in by_context["n"]} == {"chunk", "done"}


def test_pcm_f32le_is_the_same_audio_as_floats(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("f", FIRST, rate=24000, encoding="pcm_f32le", seed=2, **{"continue": False}))
            return (await client.until_done("f"))["f"]

    floats = pcm_of(asyncio.run(run()), dtype="<f4")
    expected = synthesize(FIRST, seed=2, sample_rate=24000)
    assert same_speech(floats, expected / 32767)
    assert np.sqrt(np.mean(floats**2)) > 0.02


def test_flush_done_follows_the_flushed_audio_and_numbers_the_chunks(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("f", "First, the part we flush", seed=3))
            await client.send(request("f", "", flush=True))
            await client.send(request("f", " and then the rest of it.", **{"continue": False}))
            return (await client.until_done("f"))["f"]

    messages = asyncio.run(run())
    kinds = [m["type"] for m in messages]
    assert kinds.count("flush_done") == 1 and kinds[-1] == "done"
    flush_at = kinds.index("flush_done")
    before, after = messages[:flush_at], messages[flush_at + 1 : -1]
    assert before and after and messages[flush_at]["flush_id"] == 1
    assert {m["flush_id"] for m in before if m["type"] == "chunk"} == {1}
    assert {m["flush_id"] for m in after if m["type"] == "chunk"} == {2}
    assert len(pcm_of(before)) / EMBEDDED_VOICE_RATE > 0.5 and len(pcm_of(after)) / EMBEDDED_VOICE_RATE > 0.5


def test_buffering_waits_for_the_delay_or_speaks_at_once(server: Server) -> None:
    """Text with no sentence end: spoken at once with max_buffer_delay_ms 0, after the delay otherwise."""

    async def first_chunk_after(delay_ms: int) -> float:
        async with connect(server) as ws:
            client = Client(ws)
            sent_at = await client.send(request("w", "Hello there and welcome", max_buffer_delay_ms=delay_ms))
            while (message := await client.receive())["type"] != "chunk":
                pass
            return message["received_at"] - sent_at

    # Against each other, not a fixed bound: a loaded machine's first audio alone can take most of a second.
    delayed = asyncio.run(first_chunk_after(1500))
    assert delayed >= 1.5
    assert asyncio.run(first_chunk_after(0)) < delayed - 0.75


def test_cancel_stops_a_context_and_frees_its_slot(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("long", LONG, **{"continue": False}))
            while (await client.receive())["type"] != "chunk":
                pass
            assert server.metric("rtvoice_active_streams") >= 1
            await client.send({"context_id": "long", "cancel": True})
            # Sent after the cancel on the same socket: the server has stopped "long" before it reads this.
            await client.send(request("next", FIRST, **{"continue": False}))
            await client.until_done("next")
            return client.messages

    messages = asyncio.run(run())
    first_next = next(i for i, m in enumerate(messages) if m["context_id"] == "next")
    long_messages = [m for m in messages if m["context_id"] == "long"]
    assert all(m["context_id"] != "long" for m in messages[first_next:])
    assert all(m["type"] in ("chunk", "timestamps") for m in long_messages)  # no done for a cancelled context
    assert len(pcm_of(long_messages)) / EMBEDDED_VOICE_RATE < 30  # far from the minute of audio the whole text makes
    assert messages[-1]["type"] == "done" and len(pcm_of(messages[first_next:])) > EMBEDDED_VOICE_RATE
    assert wait_for(lambda: server.metric("rtvoice_active_streams") == 0)


def test_disconnect_frees_every_context(server: Server) -> None:
    async def run() -> None:
        async with connect(server) as ws:
            client = Client(ws)
            for context_id in ("x", "y"):
                await client.send(request(context_id, LONG, **{"continue": False}))
            while (await client.receive())["type"] != "chunk":
                pass

    asyncio.run(run())
    assert wait_for(lambda: server.metric("rtvoice_active_streams") == 0)


def test_a_finished_context_id_can_be_used_again(server: Server) -> None:
    async def run() -> list[list[dict[str, Any]]]:
        async with connect(server) as ws:
            client = Client(ws)
            turns = []
            for seed in (1, 2):
                await client.send(request("turn", FIRST, seed=seed, **{"continue": False}))
                turns.append((await client.until_done("turn"))["turn"])
            return turns

    first, second = asyncio.run(run())
    assert same_speech(pcm_of(first), synthesize(FIRST, seed=1))
    assert same_speech(pcm_of(second), synthesize(FIRST, seed=2))


def test_voices_rtvoice_ids_aliases_and_cartesia_ids(server: Server) -> None:
    """An rtvoice id or alias picks that voice; a Cartesia voice id speaks with the default voice; any other
    unknown name is an error naming the valid ids."""

    async def run(voice: str) -> list[dict[str, Any]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send(request("v", FIRST, voice=voice, seed=4, **{"continue": False}))
            return (await client.until_done("v"))["v"]

    expected = synthesize(FIRST, seed=4)
    for voice in ("en_US-joe-medium", "alloy", CARTESIA_VOICE, ""):
        assert same_speech(pcm_of(asyncio.run(run(voice))), expected), voice
    (error,) = asyncio.run(run("no-such-voice"))
    assert error["type"] == "error" and error["error_code"] == "voice_not_found" and error["context_id"] == "v"
    assert error["done"] is True and error["status_code"] == 400 and "en_US-joe-medium" in error["message"]


@pytest.mark.parametrize(
    "fields,code,param",
    [
        (
            {"output_format": {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}},
            "unsupported_encoding",
            "output_format.encoding",
        ),
        (
            {"output_format": {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 8000}},
            "unsupported_format",
            "output_format.container",
        ),
        (
            {"output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 12345}},
            "unsupported_sample_rate",
            "output_format.sample_rate",
        ),
        ({"voice": {"mode": "embedding", "embedding": [0.1, 0.2]}}, "unsupported_voice_mode", "voice.mode"),
        ({"generation_config": {"speed": 9}}, "invalid_value", "generation_config.speed"),
        ({"transcript": "x" * 4097}, "input_too_long", "transcript"),
    ],
)
def test_bad_requests_get_an_error_for_their_context(
    server: Server, fields: dict[str, Any], code: str, param: str
) -> None:
    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with connect(server) as ws:
            client = Client(ws)
            await client.send({**request("bad", FIRST), **fields})
            error = await client.receive()
            # The socket stays usable, and so does the context id.
            await client.send(request("bad", FIRST, **{"continue": False}))
            return error, (await client.until_done("bad"))["bad"]

    error, after = asyncio.run(run())
    assert error["type"] == "error" and error["error_code"] == code and error["param"] == param, error
    assert error["context_id"] == "bad" and error["done"] is True and error["message"]
    assert after[-1]["type"] == "done" and len(pcm_of(after)) > 0


def test_malformed_messages_and_a_closed_context(server: Server) -> None:
    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(server) as ws:
            client = Client(ws)
            await ws.send("not json")
            await ws.send(b"\x00\x01")
            await client.send(request("c", LONG, **{"continue": False}))
            await client.send(request("c", "More text."))  # its input has ended, and it is still speaking
            errors = [await client.receive() for _ in range(2)]
            while (message := await client.receive())["type"] != "error":
                pass
            # The error ended the context: nothing more comes for it, and its id opens a new one.
            await client.send(request("c", FIRST, seed=8, **{"continue": False}))
            return [*errors, message], (await client.until_done("c"))["c"]

    (not_json, binary, closed), after = asyncio.run(run())
    assert after[-1]["type"] == "done" and same_speech(pcm_of(after), synthesize(FIRST, seed=8))
    assert not_json["error_code"] == "invalid_json" and not_json["context_id"] is None
    assert binary["error_code"] == "invalid_message" and binary["context_id"] is None
    assert closed["error_code"] == "context_closed" and closed["context_id"] == "c"


# -- /tts/bytes ------------------------------------------------------------------------------------------------


def tts_bytes(server: Server, **fields: Any) -> httpx.Response:
    body = {
        "model_id": "sonic-3",
        "transcript": FIRST,
        "voice": {"mode": "id", "id": CARTESIA_VOICE},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
        **fields,
    }
    return httpx.post(
        f"{server.url}/tts/bytes",
        json=body,
        headers={"X-API-Key": "sk-test", "Cartesia-Version": "2025-04-16"},
        timeout=60,
    )


def test_bytes_raw_wav_and_mp3(server: Server) -> None:
    expected = synthesize(FIRST, seed=9, sample_rate=24000)
    raw = tts_bytes(server, seed=9)
    assert raw.status_code == 200 and raw.headers["content-type"] == "audio/pcm"
    assert same_speech(np.frombuffer(raw.content, dtype="<i2"), expected)
    wav = tts_bytes(server, seed=9, output_format={"container": "wav", "encoding": "pcm_s16le", "sample_rate": 24000})
    header, samples = parse_wav(wav.content)
    assert header["sample_rate"] == 24000 and same_speech(samples, expected)
    mp3 = tts_bytes(server, output_format={"container": "mp3", "sample_rate": 24000, "bit_rate": 64000})
    audio, rate = decode(mp3.content)
    assert mp3.headers["content-type"] == "audio/mpeg" and rate == 24000
    assert abs(len(audio) / rate - len(expected) / 24000) < 0.5 and np.sqrt(np.mean(audio**2)) > 0.01


def test_bytes_errors(server: Server) -> None:
    bad_json = httpx.post(f"{server.url}/tts/bytes", content=b"{", timeout=10)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    empty = tts_bytes(server, transcript=" ")
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "transcript"
    f32_wav = tts_bytes(server, output_format={"container": "wav", "encoding": "pcm_f32le", "sample_rate": 24000})
    assert f32_wav.status_code == 400 and f32_wav.json()["error"]["code"] == "unsupported_encoding"
