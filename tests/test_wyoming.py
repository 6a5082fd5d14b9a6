"""The Wyoming TTS server (RTVOICE_WYOMING_URI), through the ``wyoming`` library's own client (``AsyncTcpClient``,
what Home Assistant's integration uses) against a real server on loopback: ``describe``, plain and streaming
synthesis in Home Assistant's order, ``describe`` answered while another request speaks, a connection's requests in
turn, and bad input, each followed by a fresh ``describe``. The mDNS announcement is checked in-process against a
stand-in for the ``zeroconf`` package: tests never multicast."""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import signal
import statistics
import sys
import time
import types
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info, SelectProgram
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from rtvoice.app.settings import Settings, tcp_address
from rtvoice.app.wyoming import discovery
from rtvoice.app.wyoming.framing import MAX_HEADER_LINE_BYTES
from testkit.polling import wait_for
from testkit.servers import free_port, start_rtvoice
from tests.audio import longest_silence_s
from tests.conftest import Server, settled_audio_seconds
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

VOICE = "en_US-joe-medium"
TEXT = "Home Assistant hears rtvoice over Wyoming."
REPLY = (
    "The living room lights are off now. I also turned down the heating to nineteen degrees, "
    "since nobody is home this afternoon. The front door is locked, and the garage door is closed. "
    "Tell me if you want the porch light on when you get back this evening. The weather will stay dry "
    "until tomorrow morning, when some light rain is expected, so the garden will not need watering. "
    "Your next meeting is at nine, and the dishwasher will be done in about twenty minutes."
)
"""An LLM's reply, as Home Assistant streams it: sending it 3 words every 50 ms takes about two seconds."""
LONG_TEXT = " ".join(["This sentence keeps the server busy while another client asks what it can do."] * 10)
"""About 50 s of speech: seconds of synthesis even on a fast machine."""
BLOCK_LIMIT = 1_048_576
"""The server's default RTVOICE_MAX_BODY_BYTES: the largest data or payload block it reads."""

T = TypeVar("T")


@dataclass
class Wyoming:
    server: Server
    host: str
    port: int

    def client(self, read_timeout: float = 60) -> AsyncTcpClient:
        return AsyncTcpClient(self.host, self.port, connect_timeout=10, read_timeout=read_timeout)


@pytest.fixture(scope="module")
def wyoming(start_server: Callable[..., Server]) -> Wyoming:
    port = free_port()
    return Wyoming(start_server(wyoming_uri=f"tcp://127.0.0.1:{port}"), "127.0.0.1", port)


async def wait_until(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = 10, interval: float = 0.05
) -> bool:
    """Whether ``done(await probe())`` holds before ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done(await probe()):
            return True
        await asyncio.sleep(interval)
    return False


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


@dataclass
class Answer:
    """What the server sent for one request."""

    events: list[Event] = field(default_factory=list)
    first_audio_at: float | None = None

    @property
    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def kinds(self) -> list[str]:
        """The event types, each run of ``audio-chunk``s as one."""
        kinds: list[str] = []
        for kind in self.types:
            if not (kind == "audio-chunk" and kinds and kinds[-1] == kind):
                kinds.append(kind)
        return kinds

    def chunks(self) -> list[AudioChunk]:
        return [AudioChunk.from_event(event) for event in self.events if AudioChunk.is_type(event.type)]

    def pcm(self) -> np.ndarray:
        return np.frombuffer(b"".join(chunk.audio for chunk in self.chunks()), dtype="<i2")

    def error(self) -> Error | None:
        errors = [Error.from_event(event) for event in self.events if Error.is_type(event.type)]
        return errors[0] if errors else None


async def answer(client: AsyncTcpClient, until: tuple[str, ...], audio: asyncio.Event | None = None) -> Answer:
    """Events until one of ``until`` types (or ``error``), or the connection's end; ``audio`` is set at the first
    audio."""
    got = Answer()
    while True:
        event = await client.read_event()
        if event is None:
            return got
        got.events.append(event)
        if AudioChunk.is_type(event.type) and got.first_audio_at is None:
            got.first_audio_at = time.perf_counter()
            if audio is not None:
                audio.set()
        if event.type in until or Error.is_type(event.type):
            return got


async def info_of(client: AsyncTcpClient) -> Info:
    await client.write_event(Describe().event())
    got = await answer(client, ("info",))
    assert got.types == ["info"], got.types
    return Info.from_event(got.events[0])


def describe_answers(wyoming: Wyoming) -> None:
    """A fresh connection gets its ``info``: the server lives on."""

    async def main() -> None:
        async with wyoming.client(read_timeout=10) as client:
            info = await info_of(client)
            assert info.tts[0].name == "rtvoice"

    run(main())


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pcm / 32767.0) ** 2))) if len(pcm) else 0.0


def ha_chunks(text: str, words: int = 3) -> list[str]:
    """Home Assistant's deltas of an LLM's reply: a few words each, leading spaces kept."""
    parts = text.split(" ")
    return [("" if i == 0 else " ") + " ".join(parts[i : i + words]) for i in range(0, len(parts), words)]


async def stream_like_home_assistant(
    client: AsyncTcpClient, text: str, interval_s: float = 0.05, voice: SynthesizeVoice | None = None
) -> tuple[Answer, float, float]:
    """Home Assistant's streaming sequence: ``synthesize-start``, the deltas ``interval_s`` apart, the whole text
    again as ``synthesize`` (its backwards compatibility), ``synthesize-stop``; read meanwhile, until
    ``synthesize-stopped``. The answer, when the first chunk and the stop were sent."""
    reader = asyncio.create_task(answer(client, ("synthesize-stopped",)))
    await client.write_event(SynthesizeStart(voice=voice).event())
    first_sent = time.perf_counter()
    for index, chunk in enumerate(ha_chunks(text)):
        if index:
            await asyncio.sleep(interval_s)
        await client.write_event(SynthesizeChunk(chunk).event())
    await client.write_event(Synthesize(text=text, voice=voice).event())
    await client.write_event(SynthesizeStop().event())
    stop_sent = time.perf_counter()
    return await reader, first_sent, stop_sent


# -- describe --------------------------------------------------------------------------------------------


def test_describe_gives_info_that_the_library_parses(wyoming: Wyoming) -> None:
    async def main() -> Info:
        async with wyoming.client() as client:
            return await info_of(client)

    info = run(main())
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.name == "rtvoice" and program.installed and program.supports_synthesize_streaming
    assert program.description and program.version and program.attribution.name == "rtvoice"
    assert program.attribution.url.startswith("http://127.0.0.1:")
    voice = next(voice for voice in program.voices if voice.name == VOICE)
    assert voice.languages == ["en_US"] and voice.installed and voice.description
    assert voice.attribution.name and voice.attribution.url


def test_the_info_goes_in_the_data_block(wyoming: Wyoming) -> None:
    """Home Assistant reads header lines with a 64 KiB limit: however many voices, the header stays short."""

    async def main() -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(wyoming.host, wyoming.port)
        writer.write(b'{"type": "describe"}\n')
        header = await asyncio.wait_for(reader.readline(), 10)
        data = await reader.readexactly(json.loads(header)["data_length"])
        writer.close()
        return header, data

    header, data = run(main())
    assert json.loads(header)["type"] == "info" and "data" not in json.loads(header) and len(header) < 200
    assert json.loads(data)["tts"][0]["name"] == "rtvoice"


# -- synthesis -------------------------------------------------------------------------------------------


def test_synthesize_answers_audio_at_the_voices_rate(wyoming: Wyoming) -> None:
    async def main() -> Answer:
        async with wyoming.client() as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name=VOICE)).event())
            return await answer(client, ("audio-stop",))

    got = run(main())
    assert got.kinds() == ["audio-start", "audio-chunk", "audio-stop"], got.types
    start = AudioStart.from_event(got.events[0])
    assert (start.rate, start.width, start.channels) == (EMBEDDED_VOICE_RATE, 2, 1)
    assert all((c.rate, c.width, c.channels) == (EMBEDDED_VOICE_RATE, 2, 1) for c in got.chunks())
    pcm = got.pcm()
    reference = synthesize(TEXT, seed=1)
    # Piper's durations are drawn, so the length is close, not equal.
    assert 0.8 < len(pcm) / len(reference) < 1.25 and rms(pcm) > 0.02
    stop = AudioStop.from_event(got.events[-1])
    assert stop.timestamp == pytest.approx(len(pcm) * 1000 / EMBEDDED_VOICE_RATE, abs=2)


def test_ssml_is_read_as_markup_whole_and_streamed(wyoming: Wyoming) -> None:
    """Wyoming has no field for the text's type, so ``<speak`` makes it SSML, as on every transport: a one-second
    break is silence in the audio, whole and sent in Home Assistant's chunks."""
    document = '<speak>The first part.<break time="1s"/>The second part.</speak>'

    async def main() -> tuple[Answer, Answer]:
        async with wyoming.client() as client:
            await client.write_event(Synthesize(text=document).event())
            whole = await answer(client, ("audio-stop",))
            streamed, _, _ = await stream_like_home_assistant(client, document)  # the tag split across chunks
            return whole, streamed

    for got in run(main()):
        silence_s = longest_silence_s(got.pcm(), EMBEDDED_VOICE_RATE, frame_s=0.02, quiet=0.003 * 32767)
        assert 0.9 <= silence_s <= 1.5, silence_s


def test_voice_may_be_missing_named_or_a_language(wyoming: Wyoming) -> None:
    voices = [
        None,
        SynthesizeVoice(name=VOICE, speaker="0"),
        SynthesizeVoice(language="en_US"),
        SynthesizeVoice(language="en"),
    ]

    async def main() -> list[Answer]:
        answers = []
        async with wyoming.client() as client:  # a connection carries several requests in turn
            for voice in voices:
                await client.write_event(Synthesize(text="Okay.", voice=voice).event())
                answers.append(await answer(client, ("audio-stop",)))
            await client.write_event(Synthesize(text="Okay.", voice=SynthesizeVoice(name="nobody")).event())
            answers.append(await answer(client, ("audio-stop",)))
            await client.write_event(Synthesize(text="Bonjour.", voice=SynthesizeVoice(language="fr_FR")).event())
            answers.append(await answer(client, ("audio-stop",)))
            await info_of(client)  # errors leave the connection open
        return answers

    *spoken, unknown, french = run(main())
    for got in spoken:
        assert got.kinds() == ["audio-start", "audio-chunk", "audio-stop"] and rms(got.pcm()) > 0.02
    unknown_error, french_error = unknown.error(), french.error()
    assert unknown_error is not None and unknown_error.code == "voice_not_found" and VOICE in unknown_error.text
    assert french_error is not None and french_error.code == "unsupported_language"
    assert unknown.types == ["error"] and french.types == ["error"]


def test_streaming_starts_below_the_sentence_before_the_stop_and_speaks_once(wyoming: Wyoming) -> None:
    async def main() -> tuple[Answer, float, float, Answer]:
        async with wyoming.client() as client:
            streamed, first_sent, stop_sent = await stream_like_home_assistant(client, REPLY)
            # the same connection then takes a plain request
            await client.write_event(Synthesize(text=REPLY).event())
            whole = await answer(client, ("audio-stop",))
        return streamed, first_sent, stop_sent, whole

    streamed, first_sent, stop_sent, whole = run(main())
    assert streamed.kinds() == ["audio-start", "audio-chunk", "audio-stop", "synthesize-stopped"], streamed.types
    assert streamed.first_audio_at is not None and streamed.first_audio_at < stop_sent, (
        f"first audio {streamed.first_audio_at - first_sent:.2f} s after the first chunk, "
        f"the stop {stop_sent - first_sent:.2f} s"
    )
    start = AudioStart.from_event(streamed.events[0])
    assert (start.rate, start.width, start.channels) == (EMBEDDED_VOICE_RATE, 2, 1)
    # Spoken once: the backwards-compatibility synthesize inside the session is not spoken again.
    pcm = streamed.pcm()
    assert 0.8 < len(pcm) / len(whole.pcm()) < 1.25, (len(pcm), len(whole.pcm()))
    assert rms(pcm) > 0.02


def test_a_session_with_nothing_to_speak_ends_with_synthesize_stopped(wyoming: Wyoming) -> None:
    async def main() -> tuple[Answer, Answer]:
        async with wyoming.client() as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeStop().event())
            empty = await answer(client, ("synthesize-stopped",))
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event())
            await client.write_event(SynthesizeChunk("Ignored, since the voice is unknown.").event())
            await client.write_event(SynthesizeStop().event())
            failed = await answer(client, ("error",))
            failed.events.append(await client.read_event() or Event("none"))
        return empty, failed

    empty, failed = run(main())
    assert empty.types == ["synthesize-stopped"]
    assert failed.types == ["error", "synthesize-stopped"]
    error = failed.error()
    assert error is not None and error.code == "voice_not_found"


def test_unknown_events_and_fields_are_ignored(wyoming: Wyoming) -> None:
    async def main() -> Answer:
        async with wyoming.client() as client:
            await client.write_event(SelectProgram(name="rtvoice").event())
            await client.write_event(Event(type="something-new", data={"x": 1}))
            synthesize_event = Synthesize(text="Okay.", text_format="text", context={"conversation_id": "abc"}).event()
            synthesize_event.data["unheard_of"] = True
            await client.write_event(synthesize_event)
            return await answer(client, ("audio-stop",))

    got = run(main())
    assert got.kinds() == ["audio-start", "audio-chunk", "audio-stop"]


def test_inline_data_is_accepted_as_a_data_block_is(wyoming: Wyoming) -> None:
    async def main() -> list[str]:
        reader, writer = await asyncio.open_connection(wyoming.host, wyoming.port)
        # Inline, then half inline and half in a data block (the block's fields win, as the library merges them).
        writer.write(b'{"type": "synthesize", "data": {"text": "Inline."}}\n')
        block = json.dumps({"text": "In a block."}).encode()
        header = {"type": "synthesize", "data": {"text": "overridden"}, "data_length": len(block)}
        writer.write(json.dumps(header).encode() + b"\n" + block)
        kinds = []
        while kinds.count("audio-stop") < 2:
            line = await asyncio.wait_for(reader.readline(), 60)
            head = json.loads(line)
            for length in (head.get("data_length"), head.get("payload_length")):
                if length:
                    await reader.readexactly(length)
            kinds.append(head["type"])
        writer.close()
        return kinds

    kinds = run(main())
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop" and kinds.count("audio-start") == 2
    assert "error" not in kinds


def test_describe_answers_at_once_while_another_request_speaks(wyoming: Wyoming) -> None:
    async def main() -> list[float]:
        async with wyoming.client() as speaking:
            await speaking.write_event(Synthesize(text=LONG_TEXT).event())
            audio = asyncio.Event()
            reader = asyncio.create_task(answer(speaking, ("audio-stop",), audio))
            await asyncio.wait_for(audio.wait(), 60)
            waits = []  # those answered while the synthesis was still going on
            for _ in range(5):
                async with wyoming.client() as asking:
                    asked = time.perf_counter()
                    await info_of(asking)
                    if not reader.done():
                        waits.append(time.perf_counter() - asked)
                await asyncio.sleep(0.02)
            got = await reader
            assert got.types[-1] == "audio-stop"
            return waits

    waits = run(main())
    assert len(waits) >= 3, "the synthesis ended before the describes were answered"
    assert statistics.median(waits) < 0.1, [f"{wait * 1000:.0f} ms" for wait in waits]


def test_a_client_that_leaves_mid_stream_frees_its_stream(wyoming: Wyoming) -> None:
    async def main() -> None:
        async with wyoming.client() as client:
            await client.write_event(Synthesize(text=LONG_TEXT).event())
            while True:  # until the first audio
                event = await client.read_event()
                assert event is not None
                if AudioChunk.is_type(event.type):
                    break
        async with wyoming.client() as client:  # and one that leaves in the middle of a streaming session
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(LONG_TEXT).event())
            while True:
                event = await client.read_event()
                assert event is not None
                if AudioChunk.is_type(event.type):
                    break

    run(main())
    assert wait_for(lambda: wyoming.server.metric("rtvoice_active_streams") == 0, timeout=10)
    settled_audio_seconds(wyoming.server)  # nothing more is made for them
    cancelled = wyoming.server.metric(
        "rtvoice_requests_total", {"transport": "wyoming", "route": "synthesize", "status": "cancelled"}
    )
    assert cancelled >= 1


def test_requests_and_time_to_first_audio_are_counted_by_transport(wyoming: Wyoming) -> None:
    labels = {"transport": "wyoming", "route": "synthesize", "status": "ok"}
    before = wyoming.server.metric("rtvoice_requests_total", labels)
    ttfa_before = wyoming.server.metric("rtvoice_request_time_to_first_audio_seconds_count", {"transport": "wyoming"})

    async def main() -> None:
        async with wyoming.client() as client:
            await client.write_event(Synthesize(text="Counted.").event())
            await answer(client, ("audio-stop",))

    run(main())
    assert wait_for(lambda: wyoming.server.metric("rtvoice_requests_total", labels) == before + 1)
    ttfa_after = wyoming.server.metric("rtvoice_request_time_to_first_audio_seconds_count", {"transport": "wyoming"})
    assert ttfa_after == ttfa_before + 1


# -- bad input -------------------------------------------------------------------------------------------


async def raw_exchange(wyoming: Wyoming, data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Send raw bytes; the events (header and data merged) the server answers and whether it then closed."""
    reader, writer = await asyncio.open_connection(wyoming.host, wyoming.port)
    writer.write(data)
    events: list[dict[str, Any]] = []
    closed = False
    try:
        while True:
            line = await asyncio.wait_for(reader.readline(), 10)
            if not line:
                closed = True
                break
            head = json.loads(line)
            if head.get("data_length"):
                head.setdefault("data", {}).update(json.loads(await reader.readexactly(head["data_length"])))
            events.append(head)
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return events, closed


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"this is not json\n", "invalid_event"),
        (b'{"data": {"text": "no type"}}\n', "invalid_event"),
        (b'{"type": "synthesize", "data": ["not", "an", "object"]}\n', "invalid_event"),
        (b'{"type": "synthesize", "data_length": 5}\n[1,2]', "invalid_event"),
        (b'{"type": "synthesize", "data_length": "many"}\n', "invalid_event"),
        (b"{" + b" " * (MAX_HEADER_LINE_BYTES + 10) + b"\n", "header_too_long"),
        (b"x" * (MAX_HEADER_LINE_BYTES + 10), "header_too_long"),
        (json.dumps({"type": "synthesize", "data_length": BLOCK_LIMIT + 1}).encode() + b"\n", "block_too_large"),
        (json.dumps({"type": "synthesize", "payload_length": 10**12}).encode() + b"\n", "block_too_large"),
    ],
    ids=[
        "not-json",
        "no-type",
        "data-not-an-object",
        "data-block-not-an-object",
        "data-length-not-a-number",
        "header-over-the-limit",
        "header-without-end",
        "data-length-over-the-limit",
        "payload-length-over-the-limit",
    ],
)
def test_bytes_that_are_not_an_event_get_an_error_and_the_connection_closes(
    wyoming: Wyoming, data: bytes, code: str
) -> None:
    events, closed = run(raw_exchange(wyoming, data))
    assert [event["type"] for event in events] == ["error"] and events[0]["data"]["code"] == code, events
    assert events[0]["data"]["text"]
    assert closed
    describe_answers(wyoming)


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (Event("synthesize", {"voice": {"name": VOICE}}), "invalid_value"),
        (Event("synthesize", {"text": 42}), "invalid_value"),
        (Event("synthesize", {"text": "   "}), "empty_input"),
        (Event("synthesize", {"text": "x" * 5000}), "input_too_long"),
        (Event("synthesize", {"text": "Okay.", "voice": "not-an-object"}), "invalid_value"),
        (SynthesizeChunk("no session").event(), "not_started"),
        (SynthesizeStop().event(), "not_started"),
    ],
    ids=["no-text", "text-not-a-string", "blank-text", "too-long", "voice-not-an-object", "chunk", "stop"],
)
def test_a_bad_request_gets_an_error_and_the_connection_goes_on(wyoming: Wyoming, event: Event, code: str) -> None:
    async def main() -> Answer:
        async with wyoming.client() as client:
            await client.write_event(event)
            got = await answer(client, ("audio-stop", "synthesize-stopped"))
            await info_of(client)
            return got

    got = run(main())
    error = got.error()
    assert got.types == ["error"] and error is not None and error.code == code and error.text
    describe_answers(wyoming)


def test_a_second_start_within_a_session_is_an_error(wyoming: Wyoming) -> None:
    async def main() -> list[str]:
        async with wyoming.client() as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeStart().event())
            error = await answer(client, ("error",))
            await client.write_event(SynthesizeChunk("Still one session.").event())
            await client.write_event(SynthesizeStop().event())
            rest = await answer(client, ("synthesize-stopped",))
            return [Error.from_event(error.events[0]).code or "", *rest.kinds()]

    assert run(main()) == ["stream_open", "audio-start", "audio-chunk", "audio-stop", "synthesize-stopped"]


# -- settings, start-up, drain ----------------------------------------------------------------------------


def test_wyoming_uri_settings() -> None:
    assert tcp_address("tcp://0.0.0.0:10200") == ("0.0.0.0", 10200)
    assert tcp_address("tcp://:10200") == ("127.0.0.1", 10200)  # no host: loopback only
    assert tcp_address("tcp://[::1]:10200") == ("::1", 10200)
    for bad in ("10200", "http://0.0.0.0:10200", "tcp://0.0.0.0", "tcp://0.0.0.0:0", "unix:///tmp/wyoming.sock"):
        with pytest.raises(ValueError):
            tcp_address(bad)
    assert Settings(_env_file=None).wyoming_uri is None and not Settings(_env_file=None).wyoming_zeroconf
    assert Settings(_env_file=None, wyoming_uri=" ").wyoming_address is None
    with pytest.raises(ValueError):
        Settings(_env_file=None, wyoming_uri="tcp://0.0.0.0")
    with pytest.raises(ValueError, match="RTVOICE_WYOMING_URI"):
        Settings(_env_file=None, wyoming_zeroconf=True)


def test_sigterm_lets_a_wyoming_request_finish_and_refuses_new_ones(tmp_path: Path) -> None:
    """On a server started with ``rtvoice serve --wyoming URI``."""
    port = free_port()
    server = start_rtvoice(
        {"RTVOICE_DRAIN_TIMEOUT_S": "60", "RTVOICE_WARMUP": "false"},
        log_file=tmp_path / "server.log",
        command=[sys.executable, "-m", "rtvoice.app.cli", "serve", "--wyoming", f"tcp://127.0.0.1:{port}"],
    )
    wyoming = Wyoming(server, "127.0.0.1", port)
    describe_answers(wyoming)

    async def main() -> tuple[Answer, Answer]:
        async with wyoming.client() as speaking:
            await speaking.write_event(Synthesize(text=LONG_TEXT).event())
            first = await speaking.read_event()
            assert first is not None and AudioStart.is_type(first.type)
            server.process.send_signal(signal.SIGTERM)
            async with httpx.AsyncClient(timeout=10) as http:  # until the drain has begun
                assert await wait_until(lambda: http.get(f"{server.url}/readyz"), lambda r: r.status_code == 503)
            async with wyoming.client() as late:
                await late.write_event(Synthesize(text="Too late.").event())
                refused = await answer(late, ("audio-stop",))
            finished = await answer(speaking, ("audio-stop",))
        return refused, finished

    try:
        refused, finished = run(main())
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()
    error = refused.error()
    assert error is not None and error.code == "server_shutting_down"
    assert finished.types[-1] == "audio-stop" and rms(finished.pcm()) > 0.02


# -- the announcement -------------------------------------------------------------------------------------


class FakeZeroconf:
    """A stand-in for ``zeroconf.asyncio.AsyncZeroconf``: records what it is asked, sends nothing."""

    instances: list[FakeZeroconf] = []

    def __init__(self) -> None:
        self.registered: list[tuple[Any, bool]] = []
        self.unregistered: list[Any] = []
        self.closed = False
        FakeZeroconf.instances.append(self)

    async def async_register_service(self, info: Any, allow_name_change: bool = False) -> None:
        self.registered.append((info, allow_name_change))

    async def async_unregister_service(self, info: Any) -> None:
        self.unregistered.append(info)

    async def async_close(self) -> None:
        self.closed = True


class FakeServiceInfo:
    def __init__(self, type_: str, name: str, addresses: list[bytes], port: int) -> None:
        self.type, self.name, self.addresses, self.port = type_, name, addresses, port


@pytest.fixture
def fake_zeroconf(monkeypatch: pytest.MonkeyPatch) -> type[FakeZeroconf]:
    package = types.ModuleType("zeroconf")
    package.__spec__ = importlib.machinery.ModuleSpec("zeroconf", None)
    asyncio_module = types.ModuleType("zeroconf.asyncio")
    asyncio_module.AsyncZeroconf = FakeZeroconf  # type: ignore[attr-defined]
    asyncio_module.AsyncServiceInfo = FakeServiceInfo  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zeroconf", package)
    monkeypatch.setitem(sys.modules, "zeroconf.asyncio", asyncio_module)
    FakeZeroconf.instances = []
    return FakeZeroconf


def test_the_announcement_registers_the_wyoming_service(fake_zeroconf: type[FakeZeroconf]) -> None:
    async def main() -> None:
        announcement = await discovery.announce("192.0.2.10", 10200)
        assert announcement is not None
        (zeroconf,) = fake_zeroconf.instances
        ((service, allow_name_change),) = zeroconf.registered
        assert service.type == "_wyoming._tcp.local." and service.name == "rtvoice._wyoming._tcp.local."
        assert service.addresses == [bytes([192, 0, 2, 10])] and service.port == 10200 and allow_name_change
        await announcement.withdraw()
        assert zeroconf.unregistered == [service] and zeroconf.closed

    run(main())


def test_a_server_on_loopback_announces_nothing(fake_zeroconf: type[FakeZeroconf]) -> None:
    assert run(discovery.announce("127.0.0.1", 10200)) is None
    assert fake_zeroconf.instances == []


def test_the_announcement_needs_zeroconf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="zeroconf"):
        discovery.require_zeroconf()
