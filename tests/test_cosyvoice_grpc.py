"""CosyVoice's gRPC service (RTVOICE_GRPC_PORT) with a client generated from the proto, making the calls
CosyVoice's runtime/python/grpc/client.py makes, on a server with the embedded Piper voice. CosyVoice2's
prompt and instruct requests are in tests/cosyvoice2/test_grpc.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from rtvoice.app.cosyvoice_grpc import generate as generate_module
from testkit.polling import wait_for
from testkit.servers import free_port
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

TEXT = "CosyVoice's client speaks through rtvoice."
RATE = EMBEDDED_VOICE_RATE


def test_the_committed_modules_are_generated_from_the_proto() -> None:
    for name, text in generate_module.generate().items():
        stale = f"{name} is stale: run python -m rtvoice.app.cosyvoice_grpc.generate"
        assert (generate_module.HERE / name).read_text() == text, stale


@pytest.fixture(scope="module")
def grpc_server(start_server: Callable[..., Server]) -> tuple[Server, str]:
    port = free_port()
    return start_server(grpc_port=str(port), warmup="false"), f"127.0.0.1:{port}"


def inference(stubs: Any, target: str, **payload: Any) -> bytes:
    """What client.py does: one Request with a sub-request copied in, the responses' audio concatenated."""
    messages, services = stubs
    request = messages.Request()
    for field, sub_request in payload.items():
        getattr(request, field).CopyFrom(sub_request)
    with grpc.insecure_channel(target) as channel:
        stub = services.CosyVoiceStub(channel)
        return b"".join(response.tts_audio for response in stub.Inference(request))


def rpc_error(stubs: Any, target: str, **payload: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        inference(stubs, target, **payload)
    return caught.value


def test_sft_with_a_piper_voice(cosyvoice_stubs: Any, grpc_server: tuple[Server, str]) -> None:
    messages, _ = cosyvoice_stubs
    _, target = grpc_server
    audio = np.frombuffer(
        inference(cosyvoice_stubs, target, sft_request=messages.sftRequest(spk_id="en_US-joe-medium", tts_text=TEXT)),
        dtype="<i2",
    )
    reference = synthesize(TEXT, seed=1)
    # Raw int16 at the voice's own rate; Piper's durations are drawn, so the length is close, not equal.
    assert 0.8 < len(audio) / len(reference) < 1.25
    assert np.sqrt(np.mean((audio / 32767.0) ** 2)) > 0.02
    default = np.frombuffer(
        inference(cosyvoice_stubs, target, sft_request=messages.sftRequest(tts_text=TEXT)), dtype="<i2"
    )
    assert 0.8 < len(default) / len(reference) < 1.25


def test_errors_are_grpc_statuses(cosyvoice_stubs: Any, grpc_server: tuple[Server, str]) -> None:
    messages, _ = cosyvoice_stubs
    _, target = grpc_server
    unknown = rpc_error(cosyvoice_stubs, target, sft_request=messages.sftRequest(spk_id="nobody", tts_text=TEXT))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND and "en_US-joe-medium" in unknown.details()
    empty = rpc_error(cosyvoice_stubs, target, sft_request=messages.sftRequest(spk_id="", tts_text=" "))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and "tts_text" in empty.details()
    nothing = rpc_error(cosyvoice_stubs, target)
    assert nothing.code() == grpc.StatusCode.INVALID_ARGUMENT and "sft_request" in nothing.details()
    # Prompts and instructions need CosyVoice2: this server has none, and says so.
    pcm = (np.sin(np.arange(16000) / 10) * 8000).astype("<i2").tobytes()
    for payload in (
        {"zero_shot_request": messages.zeroshotRequest(tts_text=TEXT, prompt_text="Hi.", prompt_audio=pcm)},
        {"cross_lingual_request": messages.crosslingualRequest(tts_text=TEXT, prompt_audio=pcm)},
        {
            "instruct_request": messages.instructRequest(
                tts_text=TEXT, spk_id="en_US-joe-medium", instruct_text="Speak slowly."
            )
        },
    ):
        error = rpc_error(cosyvoice_stubs, target, **payload)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "RTVOICE_COSYVOICE_DIR" in error.details()
        assert ("rtvoice-error-code", "model_not_loaded") in tuple(error.trailing_metadata())


def sft_call(stubs: Any, target: str, text: str, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[int, Any]:
    """An sft call with ``metadata``: the samples it sent back, and its trailing metadata."""
    messages, services = stubs
    with grpc.insecure_channel(target) as channel:
        call = services.CosyVoiceStub(channel).Inference(
            messages.Request(sft_request=messages.sftRequest(tts_text=text)), metadata=metadata
        )
        samples = sum(len(response.tts_audio) for response in call) // 2
        return samples, dict(call.trailing_metadata() or ())


def test_ssml_options_are_metadata(cosyvoice_stubs: Any, grpc_server: tuple[Server, str]) -> None:
    """``x-input-type`` and ``x-lexicons`` (comma-separated) in the call's metadata, what was ignored in the trailing
    ``x-ssml-ignored``, bad SSML an ``INVALID_ARGUMENT``. The proto has no seed, so the audio is judged by its
    length."""
    server, target = grpc_server
    _, trailer = sft_call(cosyvoice_stubs, target, '<speak><foo>Hi</foo> <prosody pitch="high">there</prosody></speak>')
    assert trailer["x-ssml-ignored"] == "<foo>; <prosody pitch>"
    assert "x-ssml-ignored" not in sft_call(cosyvoice_stubs, target, "<speak>Hi there.</speak>")[1]
    long = "The quick brown fox jumps over the lazy dog near the river bank"
    document = f'<speak><sub alias="Hi.">{long}</sub></speak>'
    as_ssml, _ = sft_call(cosyvoice_stubs, target, document)
    as_text, _ = sft_call(cosyvoice_stubs, target, document, (("x-input-type", "text"),))
    assert as_text > 3 * as_ssml, (as_text, as_ssml)  # the sentence (and the markup) read, not the alias
    document = pls_document("<lexeme><grapheme>tomato</grapheme><alias>" + long + "</alias></lexeme>")
    created = httpx.post(f"{server.url}/v1/lexicons", content=document, headers={"Content-Type": "application/pls+xml"})
    assert created.status_code == 201, created.text
    lexicon_id = created.json()["id"]
    try:
        plain, _ = sft_call(cosyvoice_stubs, target, "Tomato.")
        read, _ = sft_call(cosyvoice_stubs, target, "Tomato.", (("x-lexicons", f" {lexicon_id} ,{lexicon_id}"),))
        assert read > 3 * plain, (read, plain)
    finally:
        assert httpx.delete(f"{server.url}/v1/lexicons/{lexicon_id}").status_code == 204
    for metadata, param in (((("x-input-type", "xml"),), "x-input-type"), ((("x-lexicons", "lex_missing"),), None)):
        with pytest.raises(grpc.RpcError) as caught:
            sft_call(cosyvoice_stubs, target, "Hi.", metadata)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        code = dict(caught.value.trailing_metadata())["rtvoice-error-code"]
        assert code == ("invalid_value" if param else "unknown_lexicon") and (param or "") in caught.value.details()
    # SSML that does not read, found by its <speak> or forced by x-input-type: INVALID_ARGUMENT, nothing spoken.
    for text, metadata in (("<speak>One <s>two</speak>", ()), ("One <s>two", (("x-input-type", "ssml"),))):
        with pytest.raises(grpc.RpcError) as caught:
            sft_call(cosyvoice_stubs, target, text, metadata)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        assert dict(caught.value.trailing_metadata())["rtvoice-error-code"] == "invalid_ssml"
        assert "invalid SSML at character" in caught.value.details(), caught.value.details()


def pls_document(lexemes: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?><lexicon version="1.0" '
        'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" xml:lang="en-US">'
        f"{lexemes}</lexicon>"
    ).encode()


def test_a_cancelled_call_frees_its_stream(cosyvoice_stubs: Any, grpc_server: tuple[Server, str]) -> None:
    messages, services = cosyvoice_stubs
    server, target = grpc_server
    request = messages.Request(sft_request=messages.sftRequest(tts_text=" ".join([TEXT] * 40)))
    with grpc.insecure_channel(target) as channel:
        call = services.CosyVoiceStub(channel).Inference(request)
        assert len(next(call).tts_audio) > 0
        assert server.metric("rtvoice_active_streams") >= 1
        call.cancel()
    assert wait_for(lambda: server.metric("rtvoice_active_streams") == 0)


def test_without_grpcio_the_server_says_what_to_install() -> None:
    hide_grpc = "import sys; sys.modules['grpc'] = None; from rtvoice.app.cli import main; main(['serve'])"
    result = subprocess.run(
        [sys.executable, "-c", hide_grpc],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RTVOICE_GRPC_PORT": str(free_port())},
    )
    assert result.returncode == 2
    assert "RTVOICE_GRPC_PORT is set but grpcio is not installed" in result.stderr and "[grpc]" in result.stderr
