"""Faults fail one stream, not the server: a real server and voice whose model call raises or hangs (the
RTVOICE_FAULT_INJECTION test hook replaces only that call) for streams whose text carries a marker.

Each transport shows the failure to its own client (a cut-off HTTP body, an SSE ``error`` event, a WebSocket
``synthesis_failed``, a WHEP ``error`` event) while a stream running at the same time is served whole. A call that
hangs is abandoned at its deadline: its streams fail the same way, its runner slot comes back at once (every slot,
when every slot hangs), a metric counts it, and its late result, when it comes, is dropped. Bad voice files, and
a calibration call that hangs, stop the server at start-up with a message naming them.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from rtvoice.engine.core import CallDeadlines, EngineCore
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import StreamFailed
from rtvoice.engine.faults import FaultySession, FaultyVoice, parse_faults
from rtvoice.engine.models.base import SynthesisOptions, Voice, VoiceSession
from rtvoice.engine.models.piper.voice import PiperVoice
from rtvoice.engine.request import SynthesisRequest
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.stream import SpeechStream
from rtvoice.engine.voices import VoiceRegistry
from testkit.polling import wait_for
from testkit.servers import REPO, start_rtvoice
from testkit.whep_client import refused_then_spoken
from tests.audio import parse_wav, same_speech, snr_db
from tests.conftest import Server
from tests.fake_voice import FakeVoice, SimulatedRunner, Simulation

CLEAN = "A clean stream runs beside the failing one and is spoken to its very end."
SLOTS = 2
"""The faulty server's runner slots."""
ABANDONED = "rtvoice_model_calls_abandoned_total"


@dataclass(frozen=True)
class FaultTexts:
    """Texts that fail one way: ``late`` after its first sentence is spoken (a ``decode`` call), ``early`` before
    any audio (its ``encode`` call)."""

    mode: str
    late: str
    early: str


FAULTS = {
    "raise": FaultTexts(
        "raise",
        "This first sentence is spoken. The second one carries FAILDECODE and breaks.",
        "FAILENCODE breaks before any audio.",
    ),
    "hang": FaultTexts(
        "hang",
        "This first sentence is spoken. The second one carries HANGDECODE and hangs.",
        "HANGENCODE hangs before any audio.",
    ),
}


@pytest.fixture(scope="module")
def faulty_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faulty") / "server.log"


@pytest.fixture(scope="module")
def faulty(faulty_log: Path) -> Iterator[Server]:
    # One stream per model call, so a failing call holds the failing stream only. Hung calls are abandoned at
    # 8 times the longest a recent call held its slot (not the default 10, to keep the tests short).
    server = start_rtvoice(
        {
            "RTVOICE_FAULT_INJECTION": (
                "decode:FAILDECODE,encode:FAILENCODE,decode:HANGDECODE:hang,encode:HANGENCODE:hang"
            ),
            "RTVOICE_MAX_BATCH_SIZE": "1",
            "RTVOICE_RUNNER_THREADS": str(SLOTS),
            "RTVOICE_MODEL_CALL_DEADLINE_FACTOR": "8",
        },
        log_file=faulty_log,
    )
    yield server
    server.stop()


@pytest.fixture(params=list(FAULTS))
def fault(request: pytest.FixtureRequest) -> FaultTexts:
    return FAULTS[request.param]


def speech(server: Server, text: str, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/audio/speech",
        timeout=60,
        json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav", **extra},
    )


async def cut_off(
    client: httpx.AsyncClient, url: str, text: str, admitted: asyncio.Event | None = None
) -> tuple[int, bytes, BaseException | None]:
    """A request whose stream fails: its status, the body that came, and how the body ended. ``admitted`` is set
    when its status arrives, which the server sends once the stream is admitted."""
    got = b""
    async with client.stream("POST", url, data={"tts_text": text}) as response:
        if admitted is not None:
            admitted.set()
        try:
            async for chunk in response.aiter_bytes():
                got += chunk
        except httpx.HTTPError as error:
            return response.status_code, got, error
    return response.status_code, got, None


async def seeded(client: httpx.AsyncClient, url: str, text: str = CLEAN) -> np.ndarray:
    response = await client.post(url, data={"tts_text": text, "seed": "7"})
    assert response.status_code == 200
    return parse_wav(response.content)[1]


def reference(server: Server, text: str = CLEAN) -> np.ndarray:
    """The same seeded text alone, on a server at rest."""

    async def alone() -> np.ndarray:
        async with httpx.AsyncClient(timeout=60) as client:
            return await seeded(client, f"{server.url}/inference_sft", text)

    return asyncio.run(alone())


def test_the_hook_parses_and_is_off_by_default() -> None:
    assert [(f.kind, f.marker, f.mode) for f in parse_faults("decode:X, lm:Y:hang, encode:a:b")] == [
        ("decode", "X", "raise"),
        ("lm", "Y", "hang"),
        ("encode", "a:b", "raise"),
    ]
    assert parse_faults("") == []
    for bad in ("decode", "decode::hang", ":X"):
        with pytest.raises(ValueError):
            parse_faults(bad)
    assert EngineSettings(_env_file=None).fault_injection == ""


@pytest.mark.parametrize("base,wrapper", [(Voice, FaultyVoice), (VoiceSession, FaultySession)])
def test_the_faulty_voice_is_the_real_voice_in_every_hook(base: type, wrapper: type) -> None:
    """Every method of ``Voice`` and ``VoiceSession`` (cost hooks included) is the wrapped one's: a hook left to
    the base class's default would change how the engine schedules a voice under test."""
    hooks = {
        name
        for name, member in vars(base).items()
        if (callable(member) or isinstance(member, property)) and not name.startswith("_")
    }
    assert hooks and not hooks - set(vars(wrapper))


def test_http_body_that_fails_midway_is_cut_off_and_the_neighbour_is_whole(faulty: Server, fault: FaultTexts) -> None:
    abandoned = faulty.metric(ABANDONED)
    url = f"{faulty.url}/inference_sft"

    async def main() -> tuple[tuple[int, bytes, BaseException | None], np.ndarray]:
        async with httpx.AsyncClient(timeout=60) as client:  # one connection each
            return await asyncio.gather(cut_off(client, url, fault.late), seeded(client, url))

    (status, partial, error), whole = asyncio.run(main())
    assert status == 200 and isinstance(error, httpx.RemoteProtocolError), error  # an unterminated body
    assert len(partial) > 44  # the first sentence's audio had left
    want = reference(faulty)
    assert same_speech(whole, want), snr_db(want, whole)
    # A call that hangs is counted once it is abandoned; one that raises is not.
    assert faulty.metric(ABANDONED) - abandoned == (1 if fault.mode == "hang" else 0)
    assert httpx.get(f"{faulty.url}/readyz").status_code == 200


def test_failure_before_any_audio_cuts_the_body_too(faulty: Server, fault: FaultTexts) -> None:
    """The status left at once (the client knows it was admitted): a failure before any audio cuts the body."""
    with httpx.stream(
        "POST",
        f"{faulty.url}/v1/audio/speech",
        timeout=60,
        json={"model": "tts-1", "voice": "alloy", "input": fault.early, "response_format": "wav"},
    ) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            response.read()
    assert speech(faulty, "Still fine afterwards.").status_code == 200


def test_sse_gets_an_error_event_then_the_cut(faulty: Server, fault: FaultTexts) -> None:
    text = ""
    with httpx.stream(
        "POST",
        f"{faulty.url}/v1/audio/speech",
        timeout=60,
        json={"model": "tts-1", "voice": "alloy", "input": fault.late, "stream_format": "sse"},
    ) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in response.iter_text():
                text += chunk
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    audio = [event for event in events if event["type"] != "speech.word"]  # words go before their audio
    assert audio[0]["type"] == "speech.audio.delta" and audio[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "synthesis_failed"
    assert not any(event["type"] == "speech.audio.done" for event in events)


def test_websocket_utterance_fails_alone(faulty: Server, fault: FaultTexts) -> None:
    async def main() -> None:
        url = faulty.url.replace("http", "ws") + "/v1/tts/stream"
        async with websockets.connect(url) as failing, websockets.connect(url) as other:
            for ws in (failing, other):
                await ws.send(json.dumps({"type": "start"}))
                assert json.loads(await ws.recv())["type"] == "started"
            await other.send(json.dumps({"type": "text", "text": CLEAN}))
            await other.send(json.dumps({"type": "end"}))
            await failing.send(json.dumps({"type": "text", "text": fault.late}))
            await failing.send(json.dumps({"type": "flush"}))
            await failing.send(json.dumps({"type": "text", "text": "The next utterance works."}))
            await failing.send(json.dumps({"type": "end"}))
            failing_events = [json.loads(m) async for m in failing if isinstance(m, str)]
            other_events = [json.loads(m) async for m in other if isinstance(m, str)]
        errors = [e for e in failing_events if e["type"] == "error"]
        assert [(e["code"], e["utterance"]) for e in errors] == [("synthesis_failed", 0)]
        dones = [e for e in failing_events if e["type"] == "done"]
        assert [d["utterance"] for d in dones] == [1] and dones[0]["final"] and dones[0]["audio_s"] > 0.5
        assert other_events[-1]["type"] == "done" and other_events[-1]["audio_s"] > 3
        assert not any(e["type"] == "error" for e in other_events)

    asyncio.run(main())


def test_whep_utterance_fails_with_an_error_event(faulty: Server, fault: FaultTexts) -> None:
    asyncio.run(refused_then_spoken(faulty.url, fault.late, "synthesis_failed"))


def test_hung_calls_on_every_slot_are_abandoned_and_every_slot_comes_back(faulty: Server, faulty_log: Path) -> None:
    """Every runner slot hangs at once; a request behind them is still served, whole, once the calls are abandoned;
    then as many requests as there are slots run at once, whole, while the hung threads still hang."""
    abandoned = faulty.metric(ABANDONED, {"kind": "encode"})
    hung_threads = faulty.metric("rtvoice_runner_abandoned_threads")
    url = f"{faulty.url}/inference_sft"

    async def behind_hung_slots() -> tuple[list[tuple[int, bytes, BaseException | None]], np.ndarray]:
        async with httpx.AsyncClient(timeout=60) as client:
            admitted = [asyncio.Event() for _ in range(SLOTS)]
            hung = [asyncio.ensure_future(cut_off(client, url, FAULTS["hang"].early, event)) for event in admitted]
            for event in admitted:
                await event.wait()
            whole = await seeded(client, url)  # behind the hung calls
            return await asyncio.gather(*hung), whole

    hung, whole = asyncio.run(behind_hung_slots())
    for status, body, error in hung:
        assert status == 200 and isinstance(error, httpx.RemoteProtocolError) and len(body) <= 44, (status, error)
    want = reference(faulty)
    assert same_speech(whole, want), snr_db(want, whole)
    assert faulty.metric(ABANDONED, {"kind": "encode"}) - abandoned == SLOTS
    # The scheduler holds no slot for them, while their threads still hang.
    assert faulty.metric("rtvoice_model_calls_running") == 0
    assert faulty.metric("rtvoice_runner_abandoned_threads") - hung_threads == SLOTS

    async def all_slots() -> list[np.ndarray]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(seeded(client, url) for _ in range(SLOTS)))

    for got in asyncio.run(all_slots()):
        assert same_speech(got, want), snr_db(want, got)
    # The engine logs each abandoned call once, with its deadline (transports log their streams' failures).
    assert wait_for(
        lambda: (
            len(re.findall(r"rtvoice\.engine\.\w+: .* ran past its deadline of [0-9.]+ s", faulty_log.read_text()))
            == faulty.metric(ABANDONED)
        )
    )


# -- the engine, without the server ---------------------------------------------------------------------------


def test_an_abandoned_call_frees_its_slot_at_once_and_its_late_result_is_dropped(piper_voice: PiperVoice) -> None:
    """The engine with the real voice behind the hang hook: the hung call's stream fails at its deadline with the
    slot already free; when the hung call returns at last, its thread exits and nothing reaches the stream."""
    voice = FaultyVoice(piper_voice, parse_faults("decode:HANGDECODE:hang"))
    hang = FAULTS["hang"]

    async def speak(stream: SpeechStream) -> np.ndarray:
        return np.concatenate([pcm async for pcm in stream.audio()])

    async def main() -> None:
        engine = Engine(
            EngineSettings(_env_file=None, max_batch_size=1, runner_threads=SLOTS, model_call_deadline_factor=8),
            voices=VoiceRegistry([voice]),
        )
        await engine.start()
        try:
            hung = engine.open_stream(SynthesisRequest(text=hang.late, voice=voice.info.id))
            clean = engine.open_stream(
                SynthesisRequest(text=CLEAN, voice=voice.info.id, options=SynthesisOptions(seed=7))
            )

            async def fails() -> tuple[StreamFailed, bool]:
                """The failure, and whether a call of the stream still held a slot when it came."""
                try:
                    await speak(hung)
                except StreamFailed as failure:
                    return failure, any(s is hung for batch in engine.scheduler.running for s, _ in batch.items)
                raise AssertionError("the hung stream did not fail")

            (failure, holding), whole = await asyncio.gather(fails(), speak(clean))
            assert failure.code == "synthesis_failed" and "ran past its deadline" in failure.message, failure
            assert not holding and engine.runner.abandoned_threads == 1
            assert engine.metrics.registry.get_sample_value(ABANDONED, {"kind": "decode"}) == 1
            spoken_s = hung.emitted_s
            assert spoken_s > 0.5  # the first sentence

            voice.released.set()  # the hung call returns, late: its worker exits, the result goes nowhere
            assert await asyncio.to_thread(wait_for, lambda: engine.runner.abandoned_threads == 0)
            assert hung.emitted_s == spoken_s and hung.error is not None

            want = await speak(
                engine.open_stream(SynthesisRequest(text=CLEAN, voice=voice.info.id, options=SynthesisOptions(seed=7)))
            )
            assert same_speech(whole, want), snr_db(want, whole)
            again = [
                engine.open_stream(SynthesisRequest(text=CLEAN, voice=voice.info.id, options=SynthesisOptions(seed=7)))
                for _ in range(SLOTS)
            ]
            for got in await asyncio.gather(*(speak(stream) for stream in again)):
                assert same_speech(got, want), snr_db(want, got)
        finally:
            await engine.stop()

    asyncio.run(main())


def test_deadlines_follow_the_measured_costs() -> None:
    deadlines = CallDeadlines(factor=10, max_s=60)
    assert deadlines.deadline_s(0.05) == pytest.approx(0.5)
    assert deadlines.deadline_s(20.0) == 60  # the cap
    assert deadlines.deadline_s(None) == 60  # nothing measured yet

    sim = Simulation(FakeVoice(), slots=1)
    core = EngineCore(sim.scheduler, SimulatedRunner(1), deadlines)  # type: ignore[arg-type]
    sim.open("One sentence to plan a step for.")
    first = sim.scheduler.pick_batch()
    assert first is not None and core.deadline_s(first) == 60  # its kind was never measured: the cap
    sim.scheduler.fail(first, RuntimeError("set aside"))

    sim.open("A whole sentence, spoken by the simulation.")
    sim.run()  # live calls measure every kind, but the voice is not calibrated: still the cap
    sim.open("One sentence to plan a step for.")
    live = sim.scheduler.pick_batch()
    assert live is not None and sim.scheduler.costs.measured(sim.voice.cost_key, live.kind)
    assert core.deadline_s(live) == 60
    sim.scheduler.fail(live, RuntimeError("set aside"))

    asyncio.run(core.calibrate([sim.voice]))  # every call held its slot as long as the fake voice says, and no longer
    longest_s = sim.scheduler.costs.longest_hold_s(sim.voice.cost_key)
    stream = sim.open("One sentence to plan a step for.")
    batch = sim.scheduler.pick_batch()
    assert batch is not None and batch.items[0][0] is stream
    # A small call's deadline comes from the longest recent hold of its voice; a large one's from its estimate.
    assert core.deadline_s(batch) == pytest.approx(10 * max(longest_s, batch.estimate_s * sim.scheduler.safety()))
    assert core.deadline_s(replace(batch, estimate_s=100 * longest_s)) == pytest.approx(
        10 * 100 * longest_s * sim.scheduler.safety()
    )


# -- start-up -----------------------------------------------------------------------------------------------


def serve(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    from testkit.servers import free_port

    return subprocess.run(
        [sys.executable, "-m", "rtvoice.app.cli", "serve"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "RTVOICE_PORT": str(free_port()), **env},
    )


def test_a_corrupt_voice_file_stops_the_server_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx graph")
    (tmp_path / "broken.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}}))
    result = serve({"RTVOICE_VOICES_DIR": str(tmp_path)})
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cannot load the Piper voice {tmp_path / 'broken.onnx'}" in result.stderr
    assert "stopping: the engine could not start" in result.stderr


def test_a_call_that_hangs_at_calibration_stops_the_server_with_what_hung() -> None:
    # The engine's calibration speaks "Warming up." before any request: its encode call hangs.
    result = serve({"RTVOICE_FAULT_INJECTION": "encode:Warming:hang", "RTVOICE_MODEL_CALL_DEADLINE_MAX_S": "2"})
    assert result.returncode == 1, result.stderr[-2000:]
    assert re.search(r"calibrating voice \S+: its encode model call ran past 2 s", result.stderr), result.stderr[-2000:]
    assert "stopping: the engine could not start" in result.stderr


def test_invalid_settings_stop_the_server_at_once() -> None:
    for env in ({"RTVOICE_API_KEYS": "a:same,b:same"}, {"RTVOICE_FAULT_INJECTION": "nocolon"}):
        result = serve(env, timeout=60)
        assert result.returncode == 2 and "invalid setting" in result.stderr, (env, result.stderr[-1000:])
