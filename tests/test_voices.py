"""More Piper voices from a directory, listed and usable on every route."""

from __future__ import annotations

from pathlib import Path

import httpx

from rtvoice.engine.voices import embedded_voice_path
from tests.audio import parse_wav
from tests.engine_output import EMBEDDED_VOICE_RATE


def test_voices_directory(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    model = embedded_voice_path()
    (tmp_path / "en_US-second-medium.onnx").symlink_to(model)
    (tmp_path / "en_US-second-medium.onnx.json").symlink_to(Path(f"{model}.json"))
    (tmp_path / "orphan.onnx").symlink_to(model)  # no config beside it: not a voice
    server = start_server(voices_dir=str(tmp_path), openai_voice_map='{"nova": "en_US-second-medium"}', warmup="false")
    ids = [v["id"] for v in httpx.get(f"{server.url}/voices").json()]
    assert ids == ["en_US-joe-medium", "en_US-second-medium"]
    response = httpx.post(
        f"{server.url}/inference_sft", data={"tts_text": "Second voice.", "spk_id": ids[1]}, timeout=60
    )
    assert response.status_code == 200 and response.headers["x-voice"] == "en_US-second-medium"
    assert len(parse_wav(response.content)[1]) > EMBEDDED_VOICE_RATE // 2
    mapped = httpx.post(
        f"{server.url}/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "nova"}, timeout=60
    )
    assert mapped.headers["x-voice"] == "en_US-second-medium"
