"""Pronunciation lexicons the server holds: those named at startup, and those clients upload, kept across restarts.

An upload lives in ``<data_dir>/lexicons`` as ``<id>.pls`` (the document as sent, so an operator can read it or
move it into the startup list) and ``<id>.json`` (its name and when it came). Both are written atomically, the
JSON first: the ``.pls`` is what makes a lexicon exist, so a crash between the two leaves a stray JSON (removed at
the next start), never a lexicon without its name half-written. Startup lexicons are read-only: a bad one stops
the server, since an operator asked for it; a bad stored one is logged and skipped, since one file must not keep
the server or the other lexicons down.

The engine calls :meth:`LexiconStore.add` and :meth:`LexiconStore.delete` off the event loop (they write and
fsync files, and compile the lexicon's matcher); every method is safe to call from any thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rtvoice.engine.durable import fsync_directory, left_by_a_crash, remove_unfinished, write_atomically
from rtvoice.engine.errors import Conflict, InvalidRequest, StorageFailed
from rtvoice.engine.lexicon import Lexicon, lexicon_applies, parse_pls

log = logging.getLogger(__name__)

MAX_STORED = 1000
"""Uploaded lexicons at most (startup ones not counted): each is parsed and compiled in memory."""
MAX_NAME_CHARS = 256
STARTUP_MAX_BYTES = 32_000_000
STARTUP_MAX_LEXEMES = 200_000
"""An operator's lexicon (a whole pronunciation dictionary, say) may be far larger than a client's upload."""
_STORED_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""The ids a stored file may have: ``lex_`` and 16 hex digits when rtvoice made it, any plain file name stem else."""
_LISTED_IDS = 20


class UnknownLexicon(InvalidRequest):
    """A request names a lexicon the server does not hold."""

    def __init__(self, lexicon_id: str, valid: Sequence[str], param: str = "lexicons") -> None:
        self.lexicon_id = lexicon_id
        listed = ", ".join(valid[:_LISTED_IDS]) or "none"
        if len(valid) > _LISTED_IDS:
            listed += f" and {len(valid) - _LISTED_IDS} more"
        super().__init__(
            f"unknown lexicon {lexicon_id!r}; valid lexicons: {listed}", code="unknown_lexicon", param=param
        )


@dataclass(frozen=True)
class LexiconInfo:
    id: str
    name: str
    language: str
    lexemes: int
    source: str
    """``startup`` (named in the server's settings, cannot be deleted) or ``uploaded``."""
    created_at: int = 0
    """Unix seconds when it was uploaded; 0 for a startup lexicon."""


@dataclass(frozen=True)
class _Held:
    info: LexiconInfo
    lexicon: Lexicon
    created_ns: int = 0
    """When it was uploaded, finely enough to keep uploads of the same second in order across restarts."""


class LexiconStore:
    def __init__(self, directory: Path, startup: Sequence[Path] = ()) -> None:
        self.directory = Path(directory)
        self.startup = tuple(Path(p) for p in startup)
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}  # startup ones first, then uploads oldest first
        self._pending = 0  # uploads being written: they count against MAX_STORED already

    def load(self) -> None:
        """Read the startup lexicons (``ValueError`` naming a bad one) and the stored uploads (a bad one skipped)."""
        held: dict[str, _Held] = {}
        paths: dict[str, Path] = {}
        for path in self.startup:
            lexicon_id = path.stem
            if lexicon_id in paths:
                raise ValueError(f"startup lexicons {paths[lexicon_id]} and {path} share the id {lexicon_id!r}")
            paths[lexicon_id] = path
            try:
                lexicon = parse_pls(
                    path.read_bytes(), str(path), max_bytes=STARTUP_MAX_BYTES, max_lexemes=STARTUP_MAX_LEXEMES
                )
            except OSError as error:
                raise ValueError(f"cannot read the startup lexicon {path}: {error}") from error
            except InvalidRequest as error:
                raise ValueError(f"bad startup lexicon: {error.message}") from error
            lexicon.matcher()  # compiled now, not on the first request that needs it
            held[lexicon_id] = _Held(
                LexiconInfo(lexicon_id, path.name, lexicon.language, len(lexicon.lexemes), "startup"), lexicon
            )
        stored = sorted(self._load_stored(set(held)), key=lambda h: (h.created_ns, h.info.id))
        held.update((h.info.id, h) for h in stored)
        with self._lock:
            self._held = held

    def _load_stored(self, taken: set[str]) -> list[_Held]:
        if not self.directory.is_dir():
            return []
        remove_unfinished(self.directory, "lexicon")
        for orphan in self.directory.glob("*.json"):  # a crash between the JSON and the .pls: no lexicon was kept
            if not orphan.with_suffix(".pls").exists() and left_by_a_crash(orphan):
                log.warning("removing %s, the name of a lexicon whose save did not finish", orphan)
                orphan.unlink(missing_ok=True)
        found = []
        for path in sorted(self.directory.glob("*.pls")):
            lexicon_id = path.stem
            try:
                if not _STORED_ID.match(lexicon_id):
                    raise ValueError("its name is not a lexicon id")
                if lexicon_id in taken:
                    raise ValueError(f"a startup lexicon has the id {lexicon_id!r}")
                found.append(self._read_stored(path))
            except Exception as error:  # one bad file must not stop the server, nor the other lexicons
                log.error("skipping the stored lexicon %s: it cannot be used (%s); delete or replace it", path, error)
        return found

    def _read_stored(self, path: Path) -> _Held:
        """The upload stored at ``path``, parsed and ready to match (raises what reading or parsing raises)."""
        lexicon = parse_pls(path.read_bytes(), str(path))
        name, created_ns = self._read_meta(path)
        lexicon.matcher()
        info = LexiconInfo(
            path.stem, name, lexicon.language, len(lexicon.lexemes), "uploaded", created_ns // 1_000_000_000
        )
        return _Held(info, lexicon, created_ns)

    @staticmethod
    def _read_meta(path: Path) -> tuple[str, int]:
        """A stored lexicon's name and upload time; a missing or unreadable JSON costs only those."""
        meta_path = path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            return str(meta.get("name", "")), int(meta.get("created_ns", 0))
        except (OSError, ValueError, TypeError, AttributeError) as error:
            log.warning("lexicon %s: no usable %s (%s); its name is lost", path.stem, meta_path.name, error)
            try:
                return "", path.stat().st_mtime_ns
            except OSError:
                return "", 0

    def add(self, data: bytes, name: str = "", param: str = "file") -> LexiconInfo:
        """Keep an uploaded PLS document: parsed and checked first (``InvalidRequest`` naming ``param``), then
        written to disk (``StorageFailed`` when that fails) before it is served."""
        name = name.strip()
        if len(name) > MAX_NAME_CHARS:
            raise InvalidRequest(f"a lexicon's name may be at most {MAX_NAME_CHARS} characters", param="name")
        lexicon = parse_pls(data, repr(name) if name else "the uploaded lexicon", param=param)
        with self._lock:
            if self._stored_count() + self._pending >= MAX_STORED:
                raise InvalidRequest(
                    f"the server holds {MAX_STORED} uploaded lexicons, the most it keeps; delete one first",
                    code="too_many_lexicons",
                    param=param,
                )
            self._pending += 1  # the slot is taken while the files are written, outside the lock
        try:
            lexicon.matcher()  # compiled here, off the event loop, not on the first sentence that uses it
            lexicon_id = self._new_id()
            created_ns = time.time_ns()
            meta = json.dumps({"id": lexicon_id, "name": name, "created_ns": created_ns}).encode()
            target = self.directory / f"{lexicon_id}.pls"
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                write_atomically(target.with_suffix(".json"), meta)
                write_atomically(target, data)
            except OSError as error:
                with contextlib.suppress(OSError):  # the disk that failed may fail this too: the error is above
                    target.with_suffix(".json").unlink(missing_ok=True)
                raise StorageFailed(f"could not store the lexicon: {error}", code="lexicon_not_saved") from error
            info = LexiconInfo(
                lexicon_id, name, lexicon.language, len(lexicon.lexemes), "uploaded", created_ns // 1_000_000_000
            )
            with self._lock:
                self._held[lexicon_id] = _Held(info, lexicon, created_ns)
            return info
        finally:
            with self._lock:
                self._pending -= 1

    def _new_id(self) -> str:
        while True:  # 64 random bits: a clash is all but impossible, but costs nothing to rule out
            lexicon_id = "lex_" + secrets.token_hex(8)
            with self._lock:
                if lexicon_id not in self._held:
                    return lexicon_id

    def _stored_count(self) -> int:
        return sum(1 for h in self._held.values() if h.info.source == "uploaded")

    def _find(self, lexicon_id: str, param: str = "lexicons") -> _Held:
        held = self._current(lexicon_id)
        if held is None:
            raise UnknownLexicon(lexicon_id, self.ids(), param)
        return held

    # -- the directory, shared by replicas behind a balancer ---------------------------------------------------------

    def _current(self, lexicon_id: str) -> _Held | None:
        """``lexicon_id`` as the directory has it now: an upload another replica stored is read the first time it is
        named here, and one whose ``.pls`` another replica deleted is dropped (one ``stat`` per uploaded lexicon)."""
        with self._lock:
            held = self._held.get(lexicon_id)
        if held is None:
            return self._adopt(lexicon_id)
        if held.info.source == "uploaded" and not (self.directory / f"{lexicon_id}.pls").exists():
            with self._lock:
                if self._held.get(lexicon_id) is held:
                    del self._held[lexicon_id]
            return None
        return held

    def _adopt(self, lexicon_id: str) -> _Held | None:
        """An upload another replica stored, read from the directory; None when there is none (or it is unusable)."""
        path = self.directory / f"{lexicon_id}.pls"
        if not _STORED_ID.match(lexicon_id) or not path.exists():
            return None
        try:
            stored = self._read_stored(path)
        except FileNotFoundError:
            return None  # deleted meanwhile
        except Exception as error:  # a bad file costs that lexicon only
            log.error("cannot use the stored lexicon %s (%s); delete or replace it", path, error)
            return None
        with self._lock:
            return self._held.setdefault(lexicon_id, stored)

    def refresh(self) -> None:
        """Every upload in line with the directory: those other replicas stored read, those they deleted dropped."""
        on_disk = {p.stem for p in self.directory.glob("*.pls")} if self.directory.is_dir() else set()
        with self._lock:
            held = {i: h.info.source for i, h in self._held.items()}
        for lexicon_id in on_disk - set(held):
            self._adopt(lexicon_id)
        with self._lock:
            for lexicon_id in [i for i, source in held.items() if source == "uploaded" and i not in on_disk]:
                self._held.pop(lexicon_id, None)
            ordered = sorted(self._held.values(), key=lambda h: (h.info.source != "startup", h.created_ns))
            self._held = {h.info.id: h for h in ordered}

    def get(self, lexicon_id: str) -> Lexicon:
        return self._find(lexicon_id).lexicon

    def info(self, lexicon_id: str) -> LexiconInfo:
        return self._find(lexicon_id).info

    def ids(self) -> list[str]:
        """Every lexicon's id, in the order of :meth:`infos`."""
        self.refresh()
        with self._lock:
            return list(self._held)

    def infos(self) -> list[LexiconInfo]:
        """Every lexicon held: the startup ones in the order named, then uploads oldest first."""
        self.refresh()
        with self._lock:
            return [h.info for h in self._held.values()]

    def delete(self, lexicon_id: str) -> None:
        """Forget an uploaded lexicon and remove its files (requests already speaking with it finish with it)."""
        held = self._find(lexicon_id)
        if held.info.source != "uploaded":
            raise Conflict(
                f"lexicon {lexicon_id!r} is a startup lexicon and cannot be deleted; change the server's settings",
                code="lexicon_not_deletable",
                param="lexicon_id",
            )
        target = self.directory / f"{lexicon_id}.pls"
        try:
            target.unlink(missing_ok=True)  # the .pls first: once it is gone the lexicon is gone, JSON or not
            target.with_suffix(".json").unlink(missing_ok=True)
            fsync_directory(self.directory)
        except OSError as error:
            raise StorageFailed(f"could not delete the lexicon: {error}", code="lexicon_not_deleted") from error
        with self._lock:
            self._held.pop(lexicon_id, None)

    def for_voice(self, language: str, ids: Sequence[str] = ()) -> tuple[Lexicon, ...]:
        """The lexicons a request's sentences go through, first match winning: those it names, in its order (each
        applies whatever its language: the client chose it), then the startup ones for the voice's language."""
        named = [self._current(lexicon_id) for lexicon_id in ids]  # another replica may have stored or deleted it
        with self._lock:
            chosen: list[Lexicon] = []
            for lexicon_id, held in zip(ids, named, strict=True):
                if held is None:
                    raise UnknownLexicon(lexicon_id, list(self._held))
                if not any(held.lexicon is c for c in chosen):  # identity: comparing lexemes would cost more
                    chosen.append(held.lexicon)
            for held in self._held.values():
                if held.info.source == "startup" and lexicon_applies(held.lexicon, language):
                    if not any(held.lexicon is c for c in chosen):
                        chosen.append(held.lexicon)
            return tuple(chosen)
