"""Registering a voice is atomic: a full disk or a crash mid-write leaves no half-written voice, and a corrupt
model directory stops the server at start-up with a message naming it.

The disk fills for real (a child process with ``RLIMIT_FSIZE``), the crash is a real SIGKILL of a process in
the middle of its save, and the server is the real ``rtvoice serve``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.polling import wait_for
from testkit.servers import REPO, free_port
from tests.conftest import left_by_a_crash

torch = pytest.importorskip("torch")

from rtvoice.engine.models.cosyvoice2.frontend import PromptFeatures  # noqa: E402
from rtvoice.engine.models.cosyvoice2.voice_store import SavedVoice, VoiceStore  # noqa: E402

SAVE_IN_CHILD = textwrap.dedent("""
    import resource, signal, sys, torch
    from pathlib import Path
    from rtvoice.engine.models.cosyvoice2.frontend import PromptFeatures
    from rtvoice.engine.models.cosyvoice2.voice_store import SavedVoice, VoiceStore

    directory, voice_id, frames, file_limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if file_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    features = PromptFeatures(torch.zeros(1, 192), torch.zeros(1, frames // 2, dtype=torch.int32),
                              torch.randn(1, frames, 80), "Hello.", torch.ones(1, 3, dtype=torch.int32))
    try:
        VoiceStore(Path(directory)).save(SavedVoice(voice_id, voice_id, "en", "", features))
    except OSError as error:
        print("OSError", error.errno)
        sys.exit(3)
""")


def features(frames: int = 40) -> PromptFeatures:
    return PromptFeatures(
        torch.zeros(1, 192),
        torch.zeros(1, frames // 2, dtype=torch.int32),
        torch.randn(1, frames, 80),
        "Hello.",
        torch.ones(1, 3, dtype=torch.int32),
    )


def save_in_child(directory: Path, voice_id: str, frames: int, file_limit: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SAVE_IN_CHILD, str(directory), voice_id, str(frames), str(file_limit)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_full_disk_leaves_no_voice_and_keeps_the_others(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(SavedVoice("kept", "kept", "en", "", features()))
    child = save_in_child(tmp_path, "big", frames=200_000, file_limit=1_000_000)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 3 and "OSError" in out, (out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.pt"]  # no big.pt, no temporary file
    assert [voice.voice_id for voice in store.load_all()] == ["kept"]


def test_a_crash_mid_save_leaves_no_half_voice(tmp_path: Path) -> None:
    child = save_in_child(tmp_path, "crashy", frames=1_500_000)  # ~480 MB: long enough to be caught writing
    try:
        assert wait_for(lambda: any(p.name.startswith(".crashy.") for p in tmp_path.iterdir()), timeout=60)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    store = VoiceStore(tmp_path)
    target = tmp_path / "crashy.pt"
    # Either the save had already finished (a whole voice) or there is none; never a part of one.
    survivors = store.load_all()
    if target.exists():
        assert [voice.voice_id for voice in survivors] == ["crashy"]
    else:
        assert survivors == []
    # A fresh temporary file may be another replica's save in progress: it stays until it is old enough.
    partial = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    left_by_a_crash(*partial)
    assert store.load_all() == survivors
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "the crashed save's temporary file stays"


def test_a_corrupt_model_directory_stops_the_server(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "model"
    broken.mkdir()
    for item in model_dir.iterdir():
        if item.name != "llm.pt":
            (broken / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    (broken / "llm.pt").write_bytes(b"this is not a checkpoint")
    result = subprocess.run(
        [sys.executable, "-m", "rtvoice.app.cli", "serve"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "RTVOICE_PORT": str(free_port()),
            "RTVOICE_COSYVOICE_DIR": str(broken),
            "RTVOICE_DATA_DIR": str(tmp_path / "data"),
        },
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cannot load the CosyVoice2 model in {broken}" in result.stderr
