"""CosyVoice2 through the real server: every route, registered voices across a restart, bad prompts.

Random weights make noise, so these tests check lengths, headers, chunking, and that the bytes a
route streams equal what the engine makes in-process for the same voice, text and seed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest
from testkit.servers import start_rtvoice
from tests.audio import parse_wav
from tests.conftest import Server
from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")
require("kaldi_native_fbank")

# These import torch or onnx (the cosyvoice extra), so they follow require(): without it the module is skipped.
from tests.cosyvoice2.sizes import expected_chunk_samples, most_tokens, samples_per_token  # noqa: E402 (cosyvoice extra)
from tests.cosyvoice2.standins import tone_wav  # noqa: E402 (cosyvoice extra)

PROMPT_WAV = tone_wav(2.0, 44100, 2, seed=7)
PROMPT_TEXT = "Hello there, nice to meet you."


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registered-voices")


@pytest.fixture(scope="module")
def cv_server(start_server: Callable[..., Server], serving_model_dir: Path, voices_dir: Path) -> Server:
    """A server with the embedded Piper voice and the CosyVoice2 fixture (stand-in front ends, spk2info)."""
    return start_server(cosyvoice_dir=str(serving_model_dir), cosyvoice_voices_dir=str(voices_dir))


@pytest.fixture(scope="module")
def local(serving_service: Any, serving_model_dir: Path, voices_dir: Path) -> Any:
    """The engine in-process on the same weights and voices directory, to compare the server's bytes against."""
    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service
    from rtvoice.engine.models.cosyvoice2.voice_store import VoiceStore

    return CosyVoice2Service(serving_service.model, serving_model_dir, serving_service.device, VoiceStore(voices_dir))


def engine_pcm(
    service: Any, voice: Any, text: str, seed: int, rate: int | None = None, instructions: str | None = None
) -> np.ndarray:
    """int16 samples as the engine streams them (same scheduler, resampler, int16 conversion as the server)."""
    from rtvoice.engine.engine import Engine
    from rtvoice.engine.settings import EngineSettings
    from rtvoice.engine.voices import VoiceRegistry

    registry = VoiceRegistry([voice])
    registry.cosyvoice = service

    async def run() -> np.ndarray:
        engine = Engine(EngineSettings(warmup=False), voices=registry)
        await engine.start()
        try:
            options = SynthesisOptions(seed=seed, instructions=instructions)
            stream = engine.open_stream(
                SynthesisRequest(text=text, voice=voice.info.id, options=options, sample_rate=rate)
            )
            return np.concatenate([pcm async for pcm in stream.audio()])
        finally:
            await engine.stop()

    return asyncio.run(run())


def prompt_voice(service: Any, mode: str, instructions: str | None = None) -> Any:
    text = PROMPT_TEXT if mode == "zero_shot" else ""
    return service.prompt_voice(service.prompt_features(service.prompt_audio(PROMPT_WAV), text), mode, instructions)


def post(
    server: Server, route: str, data: dict[str, str], wav: bytes | None = PROMPT_WAV, method: str = "POST"
) -> httpx.Response:
    files = {"prompt_wav": ("prompt.wav", wav, "audio/wav")} if wav is not None else None
    return httpx.request(method, f"{server.url}{route}", data=data, files=files, timeout=120)


def test_voices_are_listed(cv_server: Server) -> None:
    voices = {v["id"]: v for v in httpx.get(f"{cv_server.url}/voices").json()}
    for voice_id in ("cosyvoice2-sft", "cosyvoice2-saved"):
        assert voices[voice_id]["model"] == "cosyvoice2" and voices[voice_id]["sample_rate"] == 24000
        assert voices[voice_id]["language"] == "mul"
    assert voices["en_US-joe-medium"]["model"] == "piper"
    openai_ids = {v["id"] for v in httpx.get(f"{cv_server.url}/v1/audio/voices").json()["voices"]}
    assert {"cosyvoice2-sft", "cosyvoice2-saved"} <= openai_ids


@pytest.mark.parametrize("spk_id", ["cosyvoice2-sft", "cosyvoice2-saved"])
def test_inference_sft_with_a_spk2info_speaker(cv_server: Server, local: Any, spk_id: str) -> None:
    response = httpx.post(
        f"{cv_server.url}/inference_sft", data={"tts_text": "Hi.", "spk_id": spk_id, "seed": "4"}, timeout=120
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-sample-rate"] == "24000" and response.headers["x-voice"] == spk_id
    header, samples = parse_wav(response.content)
    assert header["sample_rate"] == 24000 and header["data_size"] == 0xFFFFFFFF
    per_token = samples_per_token(local)
    assert 0 < len(samples) <= most_tokens(local, "Hi.") * per_token and len(samples) % per_token == 0
    assert np.array_equal(samples, engine_pcm(local, local.speakers[spk_id], "Hi.", seed=4))
    piper = httpx.post(
        f"{cv_server.url}/inference_sft", data={"tts_text": "Hi.", "spk_id": "en_US-joe-medium"}, timeout=60
    )
    assert piper.status_code == 200 and piper.headers["x-sample-rate"] == "22050"


def test_audio_streams_in_chunks(cv_server: Server, local: Any) -> None:
    """Two segments: the first chunk (one hop, less HiFT's held-back overlap) is sent while the rest is still
    being made."""
    with httpx.stream(
        "POST",
        f"{cv_server.url}/inference_sft",
        data={"tts_text": "Yes. Ok.", "spk_id": "cosyvoice2-sft", "format": "pcm", "seed": "1"},
        timeout=120,
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = [len(piece) for piece in response.iter_raw()]
    per_token, int16 = samples_per_token(local), 2
    tokens = most_tokens(local, "Yes.") + most_tokens(local, "Ok.")
    assert len(pieces) >= 3 and sum(pieces) == tokens * per_token * int16
    first_chunk = expected_chunk_samples(local, most_tokens(local, "Yes."), n_prompt=0)[0]  # an SFT speaker: no prompt
    assert pieces[0] <= first_chunk * int16


@pytest.mark.parametrize(
    "route,mode,fields",
    [
        ("/inference_zero_shot", "zero_shot", {"prompt_text": PROMPT_TEXT}),
        ("/inference_cross_lingual", "cross_lingual", {}),
        ("/inference_instruct2", "instruct2", {"instruct_text": "Speak slowly and warmly."}),
    ],
)
def test_prompt_routes_match_the_engine(
    cv_server: Server, local: Any, route: str, mode: str, fields: dict[str, str]
) -> None:
    response = post(cv_server, route, {"tts_text": "Hi.", "seed": "3", "format": "pcm", **fields})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/pcm" and response.headers["x-sample-rate"] == "24000"
    samples = np.frombuffer(response.content, dtype="<i2")
    voice = prompt_voice(local, mode, fields.get("instruct_text"))
    assert len(samples) % samples_per_token(local) == 0
    assert np.array_equal(samples, engine_pcm(local, voice, "Hi.", seed=3))


def test_get_with_a_multipart_body_and_resampling(cv_server: Server, local: Any) -> None:
    """CosyVoice's client sends its form with GET too; sample_rate resamples like everywhere else."""
    response = post(
        cv_server, "/inference_cross_lingual", {"tts_text": "Hi.", "seed": "8", "sample_rate": "16000"}, method="GET"
    )
    assert response.status_code == 200, response.text
    header, samples = parse_wav(response.content)
    assert header["sample_rate"] == 16000 and response.headers["x-sample-rate"] == "16000"
    native = engine_pcm(local, prompt_voice(local, "cross_lingual"), "Hi.", seed=8)
    assert abs(len(samples) / 16000 - len(native) / 24000) < 0.01
    assert np.array_equal(samples, engine_pcm(local, prompt_voice(local, "cross_lingual"), "Hi.", seed=8, rate=16000))


def speech(server: Server, voice: str, **body: Any) -> httpx.Response:
    payload = {"model": "tts-1", "input": "Hi.", "voice": voice, "response_format": "pcm", "seed": 6, **body}
    return httpx.post(f"{server.url}/v1/audio/speech", json=payload, timeout=120)


def register(server: Server, voice_id: str, **fields: str) -> httpx.Response:
    return post(server, "/v1/voices", {"voice_id": voice_id, "prompt_text": PROMPT_TEXT, **fields})


def test_register_use_and_delete_a_voice(cv_server: Server, local: Any, voices_dir: Path) -> None:
    created = register(cv_server, "alice", name="Alice", language="en")
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/v1/voices/alice"
    body = created.json()
    assert body["id"] == "alice" and body["model"] == "cosyvoice2" and body["sample_rate"] == 24000
    assert body["name"] == "Alice" and body["language"] == "en" and body["prompt_text"] == PROMPT_TEXT
    assert (voices_dir / "alice.pt").is_file()
    assert httpx.get(f"{cv_server.url}/v1/voices/alice").json() == body
    assert "alice" in {v["id"] for v in httpx.get(f"{cv_server.url}/voices").json()}
    assert register(cv_server, "alice").status_code == 409
    assert register(cv_server, "en_US-joe-medium").json()["error"]["code"] == "voice_exists"

    # Usable by id on every route; the engine in-process reads the same voice file.
    (voice,) = [v for v in local.registered_voices() if v.info.id == "alice"]
    response = speech(cv_server, "alice")
    assert response.status_code == 200, response.text
    samples = np.frombuffer(response.content, dtype="<i2")
    assert np.array_equal(samples, engine_pcm(local, voice, "Hi.", seed=6))
    sft = httpx.post(
        f"{cv_server.url}/inference_sft",
        data={"tts_text": "Hi.", "spk_id": "alice", "seed": "6", "format": "pcm"},
        timeout=120,
    )
    assert sft.content == response.content
    # OpenAI's instructions: instruct2 with the registered voice's prompt.
    instructed = speech(cv_server, "alice", instructions="Whisper.")
    assert np.array_equal(
        np.frombuffer(instructed.content, dtype="<i2"), engine_pcm(local, voice, "Hi.", seed=6, instructions="Whisper.")
    )

    deleted = httpx.delete(f"{cv_server.url}/v1/voices/alice")
    assert deleted.status_code == 204 and not (voices_dir / "alice.pt").exists()
    assert httpx.get(f"{cv_server.url}/v1/voices/alice").status_code == 404
    assert speech(cv_server, "alice").json()["error"]["code"] == "voice_not_found"
    assert httpx.delete(f"{cv_server.url}/v1/voices/alice").status_code == 404
    assert httpx.delete(f"{cv_server.url}/v1/voices/cosyvoice2-sft").json()["error"]["code"] == "voice_not_deletable"
    assert httpx.delete(f"{cv_server.url}/v1/voices/en_US-joe-medium").status_code == 409


def test_registered_voice_survives_a_restart(
    cv_server: Server, start_server: Callable[..., Server], serving_model_dir: Path, voices_dir: Path
) -> None:
    assert register(cv_server, "bob").status_code == 201
    before = speech(cv_server, "bob", seed=12)
    assert before.status_code == 200
    # A new server process on the same voices directory (warm-up off: it was tested above).
    restarted = start_server(cosyvoice_dir=str(serving_model_dir), cosyvoice_voices_dir=str(voices_dir), warmup="false")
    try:
        assert "bob" in {v["id"] for v in httpx.get(f"{restarted.url}/voices").json()}
        assert speech(restarted, "bob", seed=12).content == before.content
    finally:
        restarted.stop()


@pytest.mark.parametrize(
    "wav,code",
    [
        (b"this is not audio", "invalid_audio"),
        (tone_wav(31.0, 16000), "audio_too_long"),
        (tone_wav(2.0, amplitude=0.0), "audio_silent"),
        (tone_wav(2.0, rate=8000), "sample_rate_too_low"),
        (tone_wav(0.2), "audio_too_short"),
        (None, "missing_file"),
    ],
)
def test_bad_prompt_audio(cv_server: Server, wav: bytes | None, code: str) -> None:
    for route, fields in (
        ("/inference_zero_shot", {"tts_text": "Hi.", "prompt_text": "Hello."}),
        ("/v1/voices", {"voice_id": "carol", "prompt_text": "Hello."}),
    ):
        response = post(cv_server, route, fields, wav=wav)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == code and error["param"] == "prompt_wav", error
    assert httpx.get(f"{cv_server.url}/v1/voices/carol").status_code == 404


@pytest.mark.parametrize(
    "route,fields,param",
    [
        ("/inference_zero_shot", {"tts_text": "Hi."}, "prompt_text"),
        ("/inference_zero_shot", {"tts_text": "Hi.", "prompt_text": "  "}, "prompt_text"),
        ("/inference_instruct2", {"tts_text": "Hi."}, "instruct_text"),
        ("/inference_cross_lingual", {"tts_text": ""}, "tts_text"),
        ("/inference_cross_lingual", {"tts_text": "Hi.", "speed": "1.5"}, "speed"),
        ("/inference_cross_lingual", {"tts_text": "Hi.", "sample_rate": "12345"}, "sample_rate"),
        ("/inference_cross_lingual", {"tts_text": "Hi.", "format": "mp3"}, "format"),
        ("/v1/voices", {"voice_id": "../etc", "prompt_text": "Hello."}, "voice_id"),
        ("/v1/voices", {"prompt_text": "Hello."}, "voice_id"),
    ],
)
def test_bad_fields(cv_server: Server, route: str, fields: dict[str, str], param: str) -> None:
    response = post(cv_server, route, fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_speed_other_than_one_is_refused(cv_server: Server) -> None:
    error = speech(cv_server, "cosyvoice2-sft", speed=1.5).json()["error"]
    assert error["param"] == "speed" and "1.0" in error["message"]


def test_without_a_cosyvoice_model(server: Server) -> None:
    """The default server has no CosyVoice2 model: a clear 404 (permanent: no retry), never a 5xx."""
    for route, fields in (
        ("/inference_zero_shot", {"tts_text": "Hi.", "prompt_text": "Hello."}),
        ("/inference_cross_lingual", {"tts_text": "Hi."}),
        ("/inference_instruct2", {"tts_text": "Hi.", "instruct_text": "Softly."}),
        ("/v1/voices", {"voice_id": "dave", "prompt_text": "Hello."}),
    ):
        response = post(server, route, fields)
        assert response.status_code == 404 and "retry-after" not in response.headers, (route, response.text)
        error = response.json()["error"]
        assert error["code"] == "model_not_loaded" and "RTVOICE_COSYVOICE_DIR" in error["message"]


def test_a_wrong_model_directory_stops_the_server_at_once(tmp_path: Path) -> None:
    (tmp_path / "llm.pt").write_bytes(b"")
    env = {**os.environ, "RTVOICE_COSYVOICE_DIR": str(tmp_path), "RTVOICE_PORT": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "rtvoice.app.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "is not a CosyVoice2 model directory" in result.stderr and "cosyvoice2.yaml" in result.stderr


LOAD_TEXTS = ["Hi.", "Yes, sure.", "Ok.", "See you soon.", "Fine.", "Why not?"]
TOGETHER = 3
"""Requests sent at once at the start of the load plan."""


def test_concurrent_requests_of_different_ages_each_equal_their_solo_output(cv_server: Server, local: Any) -> None:
    """Six requests of different lengths, for an SFT speaker and a registered zero-shot voice (whose prompt puts
    its LM stream past a KV block): the first ``TOGETHER`` at once, then each once the one before has its first
    audio. Each completes, and its audio equals the same request synthesised alone in-process.

    How many run at once is admission's call, from the machine's speed: where the CPU makes this model's audio
    slower than real time, streams start one per runner slot and run side by side (a CPU's LM calls split over the
    slots), so no LM call need hold two of them here. Streams of different ages sharing LM calls are held to their
    solo output in tests/cosyvoice2/test_batching.py, and the scheduler's batching in tests/test_lanes.py."""
    assert register(cv_server, "loaded").status_code == 201
    try:
        (registered,) = [v for v in local.registered_voices() if v.info.id == "loaded"]
        voices = {"cosyvoice2-sft": local.speakers["cosyvoice2-sft"], "loaded": registered}
        plan = [(text, "loaded" if k % 2 else "cosyvoice2-sft", 100 + k) for k, text in enumerate(LOAD_TEXTS)]

        async def one(client: httpx.AsyncClient, k: int, first_audio: asyncio.Event) -> bytes:
            text, voice, seed = plan[k]
            if k % 4 < 2:  # CosyVoice's form API and OpenAI's speech API, both raw 24 kHz PCM
                request = client.build_request(
                    "POST",
                    f"{cv_server.url}/inference_sft",
                    data={"tts_text": text, "spk_id": voice, "seed": str(seed), "format": "pcm"},
                )
            else:
                request = client.build_request(
                    "POST",
                    f"{cv_server.url}/v1/audio/speech",
                    json={"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm", "seed": seed},
                )
            try:
                response = await client.send(request, stream=True)
                assert response.status_code == 200, await response.aread()
                body = bytearray()
                async for piece in response.aiter_raw():
                    body += piece
                    first_audio.set()
                return bytes(body)
            finally:
                first_audio.set()  # also when it failed: the next request goes, and gather() reports the failure

        async def run() -> list[bytes]:
            async with httpx.AsyncClient(timeout=300) as client:
                tasks = []
                for k in range(len(plan)):
                    first_audio = asyncio.Event()
                    tasks.append(asyncio.create_task(one(client, k, first_audio)))
                    if k >= TOGETHER - 1:
                        await first_audio.wait()  # the next request arrives while this one is streaming
                return await asyncio.gather(*tasks)

        bodies = asyncio.run(run())
        for (text, voice, seed), body in zip(plan, bodies, strict=True):
            samples = np.frombuffer(body, dtype="<i2")
            assert len(samples) > 0 and len(samples) % samples_per_token(local) == 0, (text, voice)
            solo = engine_pcm(local, voices[voice], text, seed=seed)
            assert np.array_equal(samples, solo), (text, voice, seed)
    finally:
        httpx.delete(f"{cv_server.url}/v1/voices/loaded")


@pytest.fixture
def hanging_cv_server(serving_model_dir: Path, voices_dir: Path) -> Iterator[Server]:
    """CosyVoice2 behind the hang hook, stopped after its test (its hung thread stays until then)."""
    server = start_rtvoice(
        {
            "RTVOICE_COSYVOICE_DIR": str(serving_model_dir),
            "RTVOICE_COSYVOICE_VOICES_DIR": str(voices_dir),
            "RTVOICE_FAULT_INJECTION": "token2wav:HANGWAV:hang",
            "RTVOICE_MAX_BATCH_SIZE": "1",
            "RTVOICE_MODEL_CALL_DEADLINE_FACTOR": "8",
        }
    )
    yield server
    server.stop()


def test_a_hung_token2wav_call_is_abandoned_and_the_neighbour_is_exact(hanging_cv_server: Server, local: Any) -> None:
    """CosyVoice2 behind the hang hook: a marked stream's token2wav call hangs and is abandoned at a deadline from
    CosyVoice2's own measured costs; its body is cut, while a request beside it, and one after it, each equal
    their solo output."""
    server = hanging_cv_server
    url = f"{server.url}/inference_sft"
    text, seed = "Hello there.", 4

    async def hung(client: httpx.AsyncClient) -> BaseException | None:
        async with client.stream(
            "POST", url, data={"tts_text": "HANGWAV stops here.", "spk_id": "cosyvoice2-sft", "format": "pcm"}
        ) as response:
            assert response.status_code == 200
            try:
                await response.aread()
            except httpx.HTTPError as error:
                return error
        return None

    async def clean(client: httpx.AsyncClient) -> np.ndarray:
        response = await client.post(
            url, data={"tts_text": text, "spk_id": "cosyvoice2-sft", "seed": str(seed), "format": "pcm"}
        )
        assert response.status_code == 200
        return np.frombuffer(response.content, dtype="<i2")

    async def run() -> tuple[BaseException | None, np.ndarray]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(hung(client), clean(client))

    error, beside = asyncio.run(run())
    assert isinstance(error, httpx.RemoteProtocolError), error
    assert server.metric("rtvoice_model_calls_abandoned_total", {"kind": "token2wav"}) == 1
    want = engine_pcm(local, local.speakers["cosyvoice2-sft"], text, seed=seed)
    assert np.array_equal(beside, want)
    after = httpx.post(
        url, data={"tts_text": text, "spk_id": "cosyvoice2-sft", "seed": str(seed), "format": "pcm"}, timeout=120
    )
    assert after.status_code == 200 and np.array_equal(np.frombuffer(after.content, dtype="<i2"), want)


def longest_zero_run_s(samples: np.ndarray, rate: int = 24000) -> float:
    """The longest run of exact silence (a pause the server made; random weights make no quiet of their own)."""
    zero = np.concatenate([[False], samples == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return float(np.max(edges[1::2] - edges[::2]) / rate) if len(edges) else 0.0


def test_ssml_on_a_cosyvoice2_voice(cv_server: Server) -> None:
    """Breaks, sub and prosody rate on a voice that streams at one speed: its audio is stretched, seed for seed."""

    def pcm(text: str) -> tuple[np.ndarray, httpx.Response]:
        response = speech(cv_server, "cosyvoice2-sft", input=text)
        assert response.status_code == 200, response.text
        return np.frombuffer(response.content, dtype="<i2"), response

    plain, _ = pcm("Hello there.")
    faster, _ = pcm('<speak><prosody rate="150%">Hello there.</prosody></speak>')
    assert abs(len(faster) - len(plain) / 1.5) <= 0.01 * 24000, (len(faster), len(plain))
    paused, _ = pcm('<speak>Hello there.<break time="700ms"/>Hello there.</speak>')
    assert 0.7 <= longest_zero_run_s(paused) <= 0.72
    alias, _ = pcm('<speak><sub alias="Hello there.">Hi</sub></speak>')
    assert np.array_equal(alias, plain)
    _, response = pcm('<speak><phoneme alphabet="ipa" ph="h\u0259lo\u028a">Hello</phoneme> there.</speak>')
    assert "phoneme" in response.headers["x-ssml-ignored"]  # no phoneme input: the word is spoken instead


def test_the_page_clones_from_a_recording(chromium, cv_server: Server) -> None:  # type: ignore[no-untyped-def]
    """The playground's cloning panel, shown because /v1/info says a model clones: a prompt recorded from Chromium's
    fake microphone (a tone), tried once through /inference_zero_shot, saved as a voice and deleted again."""
    assert httpx.get(f"{cv_server.url}/v1/info").json()["cloning"] is True
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(cv_server.url + "/")
        page.wait_for_selector("#clone:not([hidden])", timeout=20_000)
        page.fill("#text", "Hello.")
        page.click("#clone-record")  # five seconds of the fake microphone
        page.wait_for_function("window.rtvoice.recordedBytes > 0", timeout=20_000)
        page.fill("#clone-text", PROMPT_TEXT)
        page.click("#clone-try")
        page.wait_for_function("['done', 'error'].includes(window.rtvoice.state)", timeout=120_000)
        stats = page.evaluate("window.rtvoice")
        assert stats["errors"] == [] and stats["samplesPlayed"] > 0, stats["errors"]
        page.fill("#clone-id", "page-voice")
        page.click("#clone-save")
        page.wait_for_function(
            "window.rtvoice.state.startsWith('saved') || window.rtvoice.errors.length > 0", timeout=120_000
        )
        assert page.evaluate("window.rtvoice.errors") == []
        page.wait_for_selector("#voice option[value='page-voice']", state="attached", timeout=10_000)
        assert httpx.get(f"{cv_server.url}/v1/voices/page-voice").status_code == 200
        page.click("#clone-delete")
        page.wait_for_selector("#voice option[value='page-voice']", state="detached", timeout=30_000)
        assert httpx.get(f"{cv_server.url}/v1/voices/page-voice").status_code == 404
    finally:
        context.close()
