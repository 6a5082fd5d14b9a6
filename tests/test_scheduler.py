"""The scheduler: who goes first, batching that changes nothing, admission limits, cancellation, metrics."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from rtvoice.engine.engine import Engine
from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.settings import Settings
from tests.audio import snr_db
from tests.conftest import Server

LONG = " ".join(["The long story goes on and on, sentence after sentence, for a good while."] * 30)
SHORT = "Short one."


def test_new_stream_first_chunk_goes_before_a_running_long_stream() -> None:
    """Ordering, not timing: the first decision after a short stream arrives is the short stream's step."""

    async def scenario() -> None:
        # One runner slot: each decision is the scheduler's choice among all ready steps.
        engine = Engine(Settings(warmup=False, runner_threads=1))
        await engine.start()
        try:
            voice = engine.resolve_voice(None)
            long = engine.open_stream(voice, SynthesisOptions(seed=1), text=LONG)
            events = long.events()
            await events.__anext__()  # the long stream is speaking
            for _ in range(3):
                await events.__anext__()
            mark = len(engine.scheduler.decisions)
            short = engine.open_stream(voice, SynthesisOptions(seed=2), text=SHORT)
            first = [pcm async for pcm in short.audio()]
            assert first
            after = list(engine.scheduler.decisions)[mark:]
            # Every step of the short stream up to its first audio ran before any further step of the long one.
            first_decode = next(i for i, d in enumerate(after) if short.id in d.stream_ids and d.kind == "decode")
            assert [d.kind for d in after[: first_decode + 1]] == ["encode", "flow", "decode"], after[:5]
            # The short stream heads each call; a long stream's step of the same shape may share it.
            assert all(d.stream_ids[0] == short.id for d in after[: first_decode + 1]), after[:5]
            long.cancel()
        finally:
            await engine.stop()

    asyncio.run(scenario())


def test_priority_tiers() -> None:
    """About-to-run-dry streams, then streams owing first audio (oldest first), then by deadline."""

    async def scenario() -> None:
        engine = Engine(Settings(warmup=False))
        await engine.start()
        try:
            voice = engine.resolve_voice(None)
            older, newer, speaking, dry = (engine.open_stream(voice) for _ in range(4))
            now = time.monotonic()
            speaking.runs_out_at = now + 5.0
            dry.runs_out_at = now + 0.05
            margin = engine.settings.urgent_margin_ms / 1000
            order = sorted([speaking, newer, dry, older], key=lambda s: s.priority(now, margin))
            assert order == [dry, older, newer, speaking]
            for stream in (older, newer, speaking, dry):
                stream.cancel()
        finally:
            await engine.stop()

    asyncio.run(scenario())


def _seeded(server: Server, seed: int, text: str) -> bytes:
    response = httpx.post(f"{server.url}/inference_sft", data={"tts_text": text, "seed": str(seed), "format": "pcm"},
                          timeout=120)
    assert response.status_code == 200
    return response.content


def test_batching_changes_nothing(server: Server) -> None:
    """Seeded requests give the same bytes alone and when batched with others."""
    # Eight similar requests at once: while two run, the others' encoder passes queue up and share calls.
    texts = [f"Voice number {i} in the crowd speaks one clear sentence." for i in range(8)]
    alone = [_seeded(server, 100 + i, t) for i, t in enumerate(texts)]
    batches_before = server.metric("rtvoice_batch_size_sum") - server.metric("rtvoice_batch_size_count")
    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        together = list(pool.map(lambda it: _seeded(server, 100 + it[0], it[1]), enumerate(texts)))
    batched_extra = server.metric("rtvoice_batch_size_sum") - server.metric("rtvoice_batch_size_count")
    assert batched_extra > batches_before, "no call carried more than one stream"
    for a, b in zip(alone, together):
        # Padding a batch changes float rounding only: the same samples to within 60 dB.
        a_pcm, b_pcm = np.frombuffer(a, "<i2"), np.frombuffer(b, "<i2")
        assert len(a_pcm) == len(b_pcm) and snr_db(a_pcm, b_pcm) >= 60


def test_admission_limits_and_cancellation(start_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = start_server(max_active_streams="1", max_queued_streams="1")
    body = {"tts_text": LONG, "format": "pcm"}
    with httpx.Client(timeout=60) as a_client, httpx.Client(timeout=60) as b_client:
        with a_client.stream("POST", f"{server.url}/inference_sft", data=body) as a:
            a_chunks = a.iter_bytes()
            next(a_chunks)  # A is active and speaking
            with b_client.stream("POST", f"{server.url}/inference_sft", data=body) as b:
                assert b.status_code == 200  # B waits in the queue
                assert server.metric("rtvoice_queued_streams") == 1
                c = httpx.post(f"{server.url}/inference_sft", data=body, timeout=10)
                assert c.status_code == 503 and c.headers["retry-after"] == "1"
                assert c.json()["error"]["code"] == "overloaded"
                openai = httpx.post(f"{server.url}/v1/audio/speech", timeout=10,
                                    json={"model": "tts-1", "input": "Hi.", "voice": "alloy"})
                assert openai.status_code == 503 and "retry-after" in openai.headers
                assert server.metric("rtvoice_rejected_streams_total") == 2
                a.close()  # A's client leaves: B is promoted at once
                b_chunks = b.iter_bytes()
                assert len(next(b_chunks)) > 0
                assert server.metric("rtvoice_active_streams") == 1 and server.metric("rtvoice_queued_streams") == 0
                # A queue place is free again: D is admitted (and waits behind B).
                with httpx.stream("POST", f"{server.url}/inference_sft", data={"tts_text": SHORT},
                                  timeout=60) as d:
                    assert d.status_code == 200 and server.metric("rtvoice_queued_streams") == 1
    deadline = time.monotonic() + 10
    while server.metric("rtvoice_active_streams") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("rtvoice_active_streams") == 0


def test_metrics_parse_and_move(server: Server) -> None:
    def snapshot() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics").text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = sample.name + str(sorted(sample.labels.items()))
                values[key] = sample.value
        return values

    before = snapshot()
    response = httpx.post(f"{server.url}/v1/audio/speech", json={"model": "tts-1", "input": SHORT, "voice": "alloy",
                                                                  "response_format": "pcm"}, timeout=60)
    assert response.status_code == 200
    httpx.post(f"{server.url}/v1/audio/speech", json={"model": "tts-1", "input": "", "voice": "alloy"}, timeout=10)
    after = snapshot()

    def moved(name: str, **labels: str) -> float:
        key = name + str(sorted(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    voice = {"voice": "en_US-joe-medium"}
    assert moved("rtvoice_requests_total", route="/v1/audio/speech", status="200") == 1
    assert moved("rtvoice_requests_total", route="/v1/audio/speech", status="400") == 1
    assert moved("rtvoice_time_to_first_audio_seconds_count", **voice) == 1
    assert moved("rtvoice_real_time_factor_count", **voice) == 1
    assert moved("rtvoice_audio_seconds_total", **voice) > 0.5
    assert moved("rtvoice_streams_total", outcome="done") == 1
    assert moved("rtvoice_batch_size_count", kind="encode") >= 1
    assert moved("rtvoice_batch_size_count", kind="decode") >= 1
    assert moved("rtvoice_model_call_seconds_count", kind="flow") >= 1
    for name in ("rtvoice_active_streams", "rtvoice_queued_streams", "rtvoice_late_chunks_total",
                 "rtvoice_stall_seconds_total"):
        assert name + "[]" in after


def test_stream_audio_is_whole_under_concurrency(server: Server) -> None:
    """Eight concurrent streams each get all their audio, none cut or mixed with another's."""
    texts = [f"Listener number {i} hears this sentence, and then one more." for i in range(8)]
    alone = [_seeded(server, i, t) for i, t in enumerate(texts)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda it: _seeded(server, it[0], it[1]), enumerate(texts)))
    for a, b in zip(alone, together):
        a_pcm, b_pcm = np.frombuffer(a, "<i2"), np.frombuffer(b, "<i2")
        assert len(a_pcm) == len(b_pcm) and snr_db(a_pcm, b_pcm) >= 60
