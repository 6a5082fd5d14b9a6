"""CosyVoice's gRPC service with CosyVoice2 (the tiny fixture): the reference client's sft, zero-shot,
cross-lingual and instruct calls with a client generated from the proto, prompts as raw 16 kHz int16 PCM.

Random weights make noise, so these check what the model's streaming fixes: whole tokens of audio at 24 kHz
(960 samples each), no more than the LM may make, and that the prompt goes through the same checks as an upload.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("kaldi_native_fbank")

from testkit.servers import free_port  # noqa: E402
from tests.conftest import Server  # noqa: E402
from tests.cosyvoice2.sizes import most_tokens, samples_per_token  # noqa: E402
from tests.cosyvoice2.standins import tone_wav  # noqa: E402
from tests.test_cosyvoice_grpc import inference, rpc_error  # noqa: E402

TEXT = "Hi."
PROMPT_16K = tone_wav(2.0, 16000, seed=7)[44:]
"""Raw int16 PCM at 16 kHz, as CosyVoice's client sends its prompt."""


@pytest.fixture(scope="module")
def target(
    start_server: Callable[..., Server], serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    port = free_port()
    start_server(
        cosyvoice_dir=str(serving_model_dir),
        grpc_port=str(port),
        cosyvoice_voices_dir=str(tmp_path_factory.mktemp("grpc-voices")),
        warmup="false",
    )
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def check_audio(serving_service: Any) -> Callable[[bytes], np.ndarray]:
    """Whole tokens of audio, at most the LM's limit for TEXT, not silent."""
    per_token = samples_per_token(serving_service)
    limit = most_tokens(serving_service, TEXT) * per_token

    def check(audio: bytes) -> np.ndarray:
        samples = np.frombuffer(audio, dtype="<i2")
        assert 0 < len(samples) <= limit and len(samples) % per_token == 0
        assert np.abs(samples).max() > 0
        return samples

    return check


@pytest.mark.parametrize("spk_id", ["cosyvoice2-sft", "sft"])
def test_sft_with_a_spk2info_speaker(
    cosyvoice_stubs: Any, target: str, spk_id: str, check_audio: Callable[[bytes], np.ndarray]
) -> None:
    """A speaker by rtvoice's id, or by the bare spk2info name CosyVoice's clients know."""
    messages, _ = cosyvoice_stubs
    check_audio(inference(cosyvoice_stubs, target, sft_request=messages.sftRequest(spk_id=spk_id, tts_text=TEXT)))


def test_zero_shot_cross_lingual_and_instruct(
    cosyvoice_stubs: Any, target: str, check_audio: Callable[[bytes], np.ndarray]
) -> None:
    messages, _ = cosyvoice_stubs
    check_audio(
        inference(
            cosyvoice_stubs,
            target,
            zero_shot_request=messages.zeroshotRequest(
                tts_text=TEXT, prompt_text="Hello there, nice to meet you.", prompt_audio=PROMPT_16K
            ),
        )
    )
    check_audio(
        inference(
            cosyvoice_stubs,
            target,
            cross_lingual_request=messages.crosslingualRequest(tts_text=TEXT, prompt_audio=PROMPT_16K),
        )
    )
    check_audio(
        inference(
            cosyvoice_stubs,
            target,
            instruct_request=messages.instructRequest(
                tts_text=TEXT, spk_id="cosyvoice2-sft", instruct_text="Speak slowly and warmly."
            ),
        )
    )


def test_instruct_needs_a_voice_that_follows_instructions(cosyvoice_stubs: Any, target: str) -> None:
    messages, _ = cosyvoice_stubs
    error = rpc_error(
        cosyvoice_stubs,
        target,
        instruct_request=messages.instructRequest(
            tts_text=TEXT, spk_id="en_US-joe-medium", instruct_text="Speak slowly."
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "en_US-joe-medium" in error.details() and "cosyvoice2-sft" in error.details()


@pytest.mark.parametrize(
    "prompt,code",
    [
        (PROMPT_16K[:-1], "invalid_audio"),
        (PROMPT_16K[: 2 * 3200], "audio_too_short"),
        (bytes(2 * 32000), "audio_silent"),
    ],
)
def test_bad_prompt_audio(cosyvoice_stubs: Any, target: str, prompt: bytes, code: str) -> None:
    messages, _ = cosyvoice_stubs
    error = rpc_error(
        cosyvoice_stubs, target, cross_lingual_request=messages.crosslingualRequest(tts_text=TEXT, prompt_audio=prompt)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_audio" in error.details()
    assert ("rtvoice-error-code", code) in tuple(error.trailing_metadata())
