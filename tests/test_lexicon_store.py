"""The lexicon store: uploads kept on disk across restarts, startup lexicons read-only, what a crash or a bad file
leaves behind handled at the next start, and the lexicons a voice's request goes through."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rtvoice.engine import lexicon_store
from rtvoice.engine.errors import Conflict, InvalidRequest, StorageFailed
from rtvoice.engine.lexicon import PLS_NAMESPACE
from rtvoice.engine.lexicon_store import LexiconStore, UnknownLexicon
from tests.conftest import left_by_a_crash


def pls(word: str, alias: str, lang: str = "en-US") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" alphabet="ipa" '
        f'xml:lang="{lang}"><lexeme><grapheme>{word}</grapheme><alias>{alias}</alias></lexeme></lexicon>'
    ).encode()


def store_at(directory: Path, startup: tuple[Path, ...] = ()) -> LexiconStore:
    store = LexiconStore(directory, startup)
    store.load()
    return store


def test_add_get_delete(tmp_path: Path) -> None:
    store = store_at(tmp_path / "lexicons")
    assert store.infos() == []
    info = store.add(pls("GIF", "jif"), name="  tech words ")
    assert info.id.startswith("lex_") and len(info.id) == 4 + 16 and int(info.id[4:], 16) >= 0
    assert (info.name, info.language, info.lexemes, info.source) == ("tech words", "en-US", 1, "uploaded")
    assert info.created_at > 0
    assert store.get(info.id).lexemes[0].alias == "jif"
    assert store.info(info.id) == info
    assert store.infos() == [info]
    assert (tmp_path / "lexicons" / f"{info.id}.pls").read_bytes() == pls("GIF", "jif")  # kept as sent
    assert json.loads((tmp_path / "lexicons" / f"{info.id}.json").read_text())["name"] == "tech words"
    other = store.add(pls("SQL", "sequel"))
    assert other.id != info.id and other.name == ""
    assert [i.id for i in store.infos()] == [info.id, other.id]

    store.delete(info.id)
    assert [i.id for i in store.infos()] == [other.id]
    assert sorted(p.name for p in (tmp_path / "lexicons").iterdir()) == [f"{other.id}.json", f"{other.id}.pls"]
    with pytest.raises(UnknownLexicon):
        store.get(info.id)
    with pytest.raises(UnknownLexicon):
        store.delete(info.id)


def test_unknown_lexicon_error(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    known = store.add(pls("a", "b"))
    with pytest.raises(UnknownLexicon) as raised:
        store.get("lex_nope")
    error = raised.value
    assert isinstance(error, InvalidRequest)
    assert (error.code, error.param) == ("unknown_lexicon", "lexicons")
    assert "'lex_nope'" in error.message and known.id in error.message
    assert error.lexicon_id == "lex_nope" and store.ids() == [known.id]
    with pytest.raises(UnknownLexicon, match="valid lexicons: none"):
        store_at(tmp_path / "empty").info("x")


def test_bad_upload_refused_and_nothing_written(tmp_path: Path) -> None:
    store = store_at(tmp_path / "lexicons")
    with pytest.raises(InvalidRequest) as raised:
        store.add(b"<lexicon><lexeme>", name="broken.pls")
    assert (raised.value.code, raised.value.param) == ("invalid_lexicon", "file")
    assert "'broken.pls'" in raised.value.message
    with pytest.raises(InvalidRequest) as raised:
        store.add(pls("a", "b"), name="n" * 300)
    assert raised.value.param == "name"
    with pytest.raises(InvalidRequest) as raised:
        store.add(b"<x/>", param="lexicon_file")
    assert raised.value.param == "lexicon_file"
    assert store.infos() == []
    assert not (tmp_path / "lexicons").exists() or not any((tmp_path / "lexicons").iterdir())


def test_survives_a_new_store(tmp_path: Path) -> None:
    first = store_at(tmp_path)
    kept = [first.add(pls("GIF", "jif"), name="one"), first.add(pls("SQL", "sequel", lang="de"), name="two")]
    gone = first.add(pls("x", "y"))
    first.delete(gone.id)

    second = store_at(tmp_path)
    assert second.infos() == kept
    assert second.get(kept[1].id).language == "de"
    assert second.get(kept[0].id) == first.get(kept[0].id)


def test_startup_lexicons(tmp_path: Path) -> None:
    names = tmp_path / "names.pls"
    names.write_bytes(pls("Nguyen", "win"))
    german = tmp_path / "german.pls"
    german.write_bytes(pls("Bahn", "baan", lang="de-DE"))
    store = store_at(tmp_path / "lexicons", (names, german))
    infos = store.infos()
    assert [(i.id, i.name, i.source, i.language) for i in infos] == [
        ("names", "names.pls", "startup", "en-US"),
        ("german", "german.pls", "startup", "de-DE"),
    ]
    with pytest.raises(Conflict) as raised:
        store.delete("names")
    assert raised.value.code == "lexicon_not_deletable"
    assert store.get("names").lexemes[0].alias == "win"
    # Uploads come after the startup lexicons, and are the only ones counted against the limit.
    uploaded = store.add(pls("a", "b"))
    assert [i.id for i in store.infos()] == ["names", "german", uploaded.id]


def test_for_voice(tmp_path: Path) -> None:
    names = tmp_path / "names.pls"
    names.write_bytes(pls("Nguyen", "win"))
    german = tmp_path / "german.pls"
    german.write_bytes(pls("Bahn", "baan", lang="de-DE"))
    store = store_at(tmp_path / "lexicons", (names, german))
    a = store.add(pls("a", "b", lang="fr"))
    b = store.add(pls("c", "d"))

    assert store.for_voice("en_US") == (store.get("names"),)
    assert store.for_voice("de_DE") == (store.get("german"),)
    assert store.for_voice("mul") == (store.get("names"), store.get("german"))
    # Named ones first, in the request's order, whatever their language; a startup one named is not repeated.
    assert store.for_voice("en_GB", [b.id, a.id, "names"]) == (store.get(b.id), store.get(a.id), store.get("names"))
    assert store.for_voice("de", ["german", b.id, b.id]) == (store.get("german"), store.get(b.id))
    with pytest.raises(UnknownLexicon):
        store.for_voice("en", [a.id, "missing"])


def test_bad_startup_file_stops_the_server(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pls"
    bad.write_bytes(b"<lexicon><lexeme><grapheme>a</grapheme></lexeme></lexicon>")
    with pytest.raises(ValueError, match="bad.pls"):
        store_at(tmp_path / "lexicons", (bad,))
    with pytest.raises(ValueError, match="missing.pls"):
        store_at(tmp_path / "lexicons", (tmp_path / "missing.pls",))
    good = tmp_path / "a" / "same.pls"
    good.parent.mkdir()
    good.write_bytes(pls("a", "b"))
    twin = tmp_path / "b" / "same.pls"
    twin.parent.mkdir()
    twin.write_bytes(pls("a", "b"))
    with pytest.raises(ValueError, match="share the id 'same'"):
        store_at(tmp_path / "lexicons", (good, twin))


def test_leftovers_of_a_crashed_save_removed_and_a_save_in_progress_kept(tmp_path: Path) -> None:
    """What a crash left is removed at start; what another replica on the same directory is writing now is not
    (the CI once lost an upload to a server starting beside it)."""
    store = store_at(tmp_path)
    kept = store.add(pls("a", "b"))
    partial = tmp_path / ".lex_0123456789abcdef.pls.abcd.tmp"
    partial.write_bytes(b"<lexicon")
    orphan = tmp_path / "lex_fedcba9876543210.json"  # the name was written, the .pls never was
    orphan.write_text('{"name": "lost"}')
    left_by_a_crash(partial, orphan)
    writing = tmp_path / ".lex_00000000000000bb.pls.efgh.tmp"
    writing.write_bytes(b"<lexicon")
    named = tmp_path / "lex_00000000000000bb.json"  # its JSON is written first
    named.write_text('{"name": "in progress"}')

    again = store_at(tmp_path)
    assert not partial.exists() and not orphan.exists()
    assert writing.exists() and named.exists()
    assert again.infos() == [kept]
    writing.replace(tmp_path / "lex_00000000000000bb.pls")  # the other replica's save finishes
    (tmp_path / "lex_00000000000000bb.pls").write_bytes(pls("c", "d"))
    assert again.info("lex_00000000000000bb").name == "in progress"


def test_bad_stored_file_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = store_at(tmp_path)
    good = store.add(pls("a", "b"), name="good")
    (tmp_path / "lex_00000000000000ff.pls").write_bytes(b"not xml at all")
    (tmp_path / "lex_00000000000000ff.json").write_text('{"name": "bad"}')
    nameless = tmp_path / "lex_00000000000000aa.pls"
    nameless.write_bytes(pls("c", "d"))  # no JSON: served, with its name lost
    (tmp_path / "has space.pls").write_bytes(pls("e", "f"))

    with caplog.at_level(logging.ERROR, logger=lexicon_store.__name__):
        again = store_at(tmp_path)
    by_id = {i.id: i for i in again.infos()}
    assert set(by_id) == {good.id, "lex_00000000000000aa"}
    assert by_id[good.id].name == "good" and by_id["lex_00000000000000aa"].name == ""
    assert "lex_00000000000000ff.pls" in caplog.text and "has space.pls" in caplog.text


def test_stored_file_clashing_with_a_startup_id_skipped(tmp_path: Path) -> None:
    startup = tmp_path / "names.pls"
    startup.write_bytes(pls("a", "startup"))
    (tmp_path / "lexicons").mkdir()
    (tmp_path / "lexicons" / "names.pls").write_bytes(pls("a", "stored"))
    store = store_at(tmp_path / "lexicons", (startup,))
    assert [(i.id, i.source) for i in store.infos()] == [("names", "startup")]
    assert store.get("names").lexemes[0].alias == "startup"


def test_too_many_lexicons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexicon_store, "MAX_STORED", 2)
    startup = tmp_path / "names.pls"
    startup.write_bytes(pls("a", "b"))
    store = store_at(tmp_path / "lexicons", (startup,))
    first = store.add(pls("a", "b"))
    store.add(pls("c", "d"))
    with pytest.raises(InvalidRequest) as raised:
        store.add(pls("e", "f"))
    assert raised.value.code == "too_many_lexicons"
    assert len(store.infos()) == 3
    store.delete(first.id)
    store.add(pls("e", "f"))  # a slot freed


def test_disk_failure_is_storage_failed(tmp_path: Path) -> None:
    blocked = tmp_path / "lexicons"
    blocked.write_text("a file where the directory should be")
    store = store_at(blocked)
    with pytest.raises(StorageFailed) as raised:
        store.add(pls("a", "b"))
    assert raised.value.code == "lexicon_not_saved"
    assert store.infos() == []
    blocked.unlink()  # the store stays usable: the failed upload's slot is free again
    info = store.add(pls("a", "b"))
    assert store.infos() == [info]


def test_replicas_sharing_the_directory_see_each_others_uploads_and_deletions(tmp_path: Path) -> None:
    """Two stores on one directory, as two replicas behind a balancer: an upload through one is found by the other
    when named (and listed), and a deletion through either is gone from both."""
    one, other = store_at(tmp_path), store_at(tmp_path)
    info = one.add(pls("tomato", "love apple"), name="fruit")
    assert other.info(info.id).name == "fruit"
    (lexicon,) = other.for_voice("en-US", [info.id])
    assert lexicon.lexemes[0].graphemes == ("tomato",)
    later = one.add(pls("potato", "earth apple"))
    assert [i.id for i in other.infos()] == [info.id, later.id]
    other.delete(info.id)
    with pytest.raises(UnknownLexicon):
        one.for_voice("en-US", [info.id])
    assert [i.id for i in one.infos()] == [later.id]
