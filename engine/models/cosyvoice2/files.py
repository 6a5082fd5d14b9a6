"""What a CosyVoice2 model directory must hold, checked without torch (the CLI fails fast with it)."""

from __future__ import annotations

from pathlib import Path

REQUIRED_FILES = ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json")


class CosyVoiceDirError(RuntimeError):
    """RTVOICE_COSYVOICE_DIR does not name a usable CosyVoice2 model directory."""


def check_model_dir(path: Path) -> None:
    """Raise CosyVoiceDirError, naming the setting and what is missing, unless ``path`` is a CosyVoice2 directory."""
    path = Path(path)
    if not path.is_dir():
        raise CosyVoiceDirError(f"RTVOICE_COSYVOICE_DIR={path} is not a directory")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        hint = " (a CosyVoice 1 directory?)" if (path / "cosyvoice.yaml").is_file() else ""
        raise CosyVoiceDirError(
            f"RTVOICE_COSYVOICE_DIR={path} is not a CosyVoice2 model directory{hint}: missing {', '.join(missing)}"
        )
