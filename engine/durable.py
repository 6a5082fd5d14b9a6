"""Files rtvoice keeps across restarts (registered voices, uploaded lexicons), written so that a crash or a full disk
leaves the old file or the whole new one, never part of one."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"
"""What a write in progress is called (with a leading dot)."""
UNFINISHED_AFTER_S = 600.0
"""A part-written file untouched this long was left by a crash. Younger ones are left alone: the directory may be
shared by replicas, and one starting must not remove the file another is writing (a save takes milliseconds)."""


def key_name(key: dict[str, Any]) -> str:
    """The file or folder name of what is kept under ``key`` (a JSON object): its canonical form's SHA-256."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def fsync_directory(directory: Path) -> None:
    """Make a rename (or a removal) in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(target: Path, data: bytes | memoryview) -> None:
    """Write to a temporary file beside ``target``, flush it to the disk, rename it over ``target`` and flush the
    rename."""
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def left_by_a_crash(path: Path) -> bool:
    """Whether ``path``, part of a save, has gone untouched too long to be one still in progress (False once it is
    gone)."""
    try:
        return time.time() - path.stat().st_mtime > UNFINISHED_AFTER_S
    except FileNotFoundError:
        return False


def remove_unfinished(directory: Path, what: str) -> None:
    """Remove the temporary files crashed writes left in ``directory`` (never a whole file, nor a write that may still
    be going on in another process)."""
    for partial in directory.glob(f".*{TEMP_SUFFIX}"):
        if left_by_a_crash(partial):
            log.warning("removing %s, a %s file a crashed save left unfinished", partial, what)
            partial.unlink(missing_ok=True)
