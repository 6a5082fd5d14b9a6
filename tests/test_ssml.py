"""SSML, inline tags and lexicons through the real server: judged by the audio, the word timings and the marks.

Round trips on OpenAI's route (audio and SSE), rtvoice's WebSocket and Cartesia's WebSocket; lexicons uploaded
over HTTP; bad and hostile documents refused within a bound, with a stream already speaking undisturbed."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets

from rtvoice.engine.arpabet import arpabet_to_ipa
from testkit.alignment import heard_as, to_aligner, transcribe
from testkit.servers import seed_caches
from testkit.whep_client import WhepPlayer
from tests.audio import frames_rms, longest_silence_s, parse_wav, rms, same_speech
from tests.conftest import Server

RATE = 24_000
"""OpenAI's route speaks at 24 kHz."""
FRAME_S = 0.01
QUIET = 100
"""A 10 ms frame below this RMS (int16) is silence: the voice's speech is hundreds to thousands."""
MARKUP_WORDS = {"speak", "break", "time", "prosody", "rate", "amazon", "effect", "sub", "alias", "mark", "ssml"}


def speech(server: Server, text: str, **fields: Any) -> httpx.Response:
    body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm", "seed": 7, **fields}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)


def pcm(server: Server, text: str, **fields: Any) -> np.ndarray:
    response = speech(server, text, **fields)
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2")


def sse(server: Server, text: str, **fields: Any) -> list[dict[str, Any]]:
    response = speech(server, text, stream_format="sse", **fields)
    assert response.status_code == 200, response.text
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def speech_s(samples: np.ndarray, rate: int = RATE) -> float:
    """From the first loud frame to the last: the speech, without the voice's silence at either end."""
    loud = np.flatnonzero(frames_rms(samples, rate, FRAME_S) >= QUIET)
    return 0.0 if not len(loud) else (loud[-1] - loud[0] + 1) * FRAME_S


def heard(samples: np.ndarray, rate: int = RATE) -> list[str]:
    return transcribe(to_aligner(samples, rate))


def assert_heard_without_markup(samples: np.ndarray, some_words: set[str], rate: int = RATE) -> None:
    """The recogniser hears none of the markup's words, and some of the speech's (so that it heard anything)."""
    words = set(heard(samples, rate))
    assert not words & MARKUP_WORDS, words
    assert words & some_words, words


# -- OpenAI's route: audio ----------------------------------------------------------------------------------------

BREAK_DOC = '<speak>The first part is done.<break time="1200ms"/>The second part starts now.</speak>'


def test_a_break_is_a_silence_of_its_length_and_no_markup_is_heard(server: Server) -> None:
    plain = pcm(server, "The first part is done. The second part starts now.")
    with_break = pcm(server, BREAK_DOC)
    assert 1.0 <= longest_silence_s(with_break, RATE) <= 1.6
    assert longest_silence_s(plain, RATE) < 0.8
    words = set(heard(with_break))
    assert not words & MARKUP_WORDS, words
    assert {"first", "second"} <= words  # the recogniser hears the speech itself


def test_a_break_at_the_start_is_kept_and_speed_does_not_shorten_it(server: Server) -> None:
    audio = pcm(server, '<speak><break time="1s"/>Then the speech.</speak>', speed=2.0)
    loud = np.flatnonzero(frames_rms(audio, RATE, FRAME_S) >= QUIET)
    assert 1.0 <= loud[0] * FRAME_S <= 1.4  # the break, then the voice's own short lead-in
    assert_heard_without_markup(audio, {"then", "speech"})


def test_prosody_rate_changes_the_speech_length(server: Server) -> None:
    sentence = "The quick brown fox jumps over the lazy dog near the river bank."
    normal = speech_s(pcm(server, sentence))
    slow_audio = pcm(server, f'<speak><prosody rate="slow">{sentence}</prosody></speak>')
    fast_audio = pcm(server, f'<speak><prosody rate="150%">{sentence}</prosody></speak>')
    slow, fast = speech_s(slow_audio), speech_s(fast_audio)
    assert slow >= 1.15 * normal, (slow, normal)
    assert 0.55 * normal <= fast <= 0.8 * normal, (fast, normal)
    for audio in (slow_audio, fast_audio):
        assert_heard_without_markup(audio, {"quick", "brown", "fox", "lazy", "dog", "river"})


def test_prosody_volume_is_a_gain(server: Server) -> None:
    sentence = "A steady sentence at one level."
    normal = rms(pcm(server, sentence).astype(np.float32))
    soft = rms(pcm(server, f'<speak><prosody volume="-6dB">{sentence}</prosody></speak>').astype(np.float32))
    assert soft / normal == pytest.approx(10 ** (-6 / 20), rel=0.05)


def test_what_was_ignored_is_in_a_header(server: Server) -> None:
    response = speech(
        server,
        '<speak><amazon:effect name="whispered">Quiet</amazon:effect> <prosody pitch="+2st">words</prosody>.</speak>',
    )
    assert response.status_code == 200
    ignored = response.headers["x-ssml-ignored"]
    assert "<amazon:effect>" in ignored and "pitch" in ignored
    assert "x-ssml-ignored" not in speech(server, "<speak>Nothing to ignore.</speak>").headers


# -- OpenAI's route: word timings and marks (SSE) -----------------------------------------------------------------


def test_an_alias_is_what_word_timings_report_and_a_mark_falls_inside_its_word(server: Server) -> None:
    doc = '<speak>Ask <sub alias="World Wide Web">WWW</sub> today. Then <mark name="here"/>listen carefully.</speak>'
    events = sse(server, doc)
    words = [e for e in events if e["type"] == "speech.word"]
    marks = [e for e in events if e["type"] == "speech.mark"]
    assert [w["text"] for w in words] == ["Ask", "World Wide Web", "today", "Then", "listen", "carefully"]
    alias = words[1]
    assert doc[alias["char_start"] : alias["char_end"]] == '<sub alias="World Wide Web">WWW</sub>'
    (mark,) = marks
    listen = words[4]
    assert mark["name"] == "here" and mark["char_start"] == doc.index("<mark")
    assert listen["start_s"] <= mark["start_s"] <= listen["end_s"]
    # The mark goes out before the audio that holds it.
    position = events.index(mark)
    audio_before = sum(
        len(base64.b64decode(e["audio"])) for e in events[:position] if e["type"] == "speech.audio.delta"
    )
    assert audio_before / 2 / RATE <= mark["start_s"] + 0.02
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert_heard_without_markup(np.frombuffer(audio, dtype="<i2"), {"world", "wide", "web", "listen", "carefully"})


# -- pronunciations -----------------------------------------------------------------------------------------------

POTATO_IPA = "p\u0259t\u02c8e\u026a\u027eo\u028a"


def pls(*entries: str, language: str = "en-US") -> bytes:
    body = "".join(entries)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" '
        f'alphabet="ipa" xml:lang="{language}">{body}</lexicon>'
    ).encode()


@contextmanager
def uploaded_lexicon(server: Server) -> Iterator[str]:
    """A lexicon that reads "tomato" as "potato", uploaded for the block; its id."""
    document = pls(f"<lexeme><grapheme>tomato</grapheme><phoneme>{POTATO_IPA}</phoneme></lexeme>")
    created = httpx.post(
        f"{server.url}/v1/lexicons?name=potato", content=document, headers={"Content-Type": "application/pls+xml"}
    )
    assert created.status_code == 201, created.text
    try:
        yield created.json()["id"]
    finally:
        assert httpx.delete(f"{server.url}/v1/lexicons/{created.json()['id']}").status_code == 204


def test_a_lexicon_changes_the_phonemes_the_voice_gets(server: Server) -> None:
    document = pls(
        f"<lexeme><grapheme>tomato</grapheme><phoneme>{POTATO_IPA}</phoneme></lexeme>",
        "<lexeme><grapheme>R2-D2</grapheme><alias>artoo deetoo</alias></lexeme>",
    )
    created = httpx.post(
        f"{server.url}/v1/lexicons?name=test", content=document, headers={"Content-Type": "application/pls+xml"}
    )
    assert created.status_code == 201, created.text
    lexicon = created.json()
    try:
        assert lexicon["lexemes"] == 2 and lexicon["source"] == "uploaded"
        listed = httpx.get(f"{server.url}/v1/lexicons").json()["lexicons"]
        assert lexicon["id"] in [entry["id"] for entry in listed]
        text = "I like tomato soup."
        with_lexicon = pcm(server, text, lexicons=[lexicon["id"]])
        as_phonemes = pcm(server, f"I like [[{POTATO_IPA}]] soup.")  # Piper's inline syntax: the same ids
        assert same_speech(with_lexicon, as_phonemes)
        assert not same_speech(with_lexicon, pcm(server, text))
        # An alias applies before normalisation: "R2-D2" is not read "R two D two".
        events = sse(server, "Meet R2-D2 today.", lexicons=[lexicon["id"]])
        assert [e["text"] for e in events if e["type"] == "speech.word"] == ["Meet", "R2-D2", "today"]
        assert same_speech(
            pcm(server, "Meet R2-D2 today.", lexicons=[lexicon["id"]]), pcm(server, "Meet artoo deetoo today.")
        )
        unknown = speech(server, text, lexicons=["lex_missing"])
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_lexicon"
    finally:
        assert httpx.delete(f"{server.url}/v1/lexicons/{lexicon['id']}").status_code == 204
    assert httpx.get(f"{server.url}/v1/lexicons/{lexicon['id']}").status_code == 404


def test_an_uploaded_lexicon_survives_a_restart(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """Uploads are kept in the data directory: a server started again on it knows the lexicon by its id and reads
    the text with it as before."""
    data = tmp_path / "data"
    seed_caches(data)  # what the voice measured at other starts: not again
    first = start_server(data_dir=str(data), warmup="false")
    created = httpx.post(
        f"{first.url}/v1/lexicons?name=potato",
        content=pls(f"<lexeme><grapheme>tomato</grapheme><phoneme>{POTATO_IPA}</phoneme></lexeme>"),
        headers={"Content-Type": "application/pls+xml"},
    )
    assert created.status_code == 201, created.text
    lexicon_id = created.json()["id"]
    text = "I like tomato soup."
    before = pcm(first, text, lexicons=[lexicon_id])
    first.stop()
    second = start_server(data_dir=str(data), warmup="false")
    kept = httpx.get(f"{second.url}/v1/lexicons/{lexicon_id}")
    assert kept.status_code == 200 and kept.json()["source"] == "uploaded", kept.text
    after = pcm(second, text, lexicons=[lexicon_id])
    assert same_speech(after, before) and not same_speech(after, pcm(second, text))


def test_input_type_and_lexicons_on_piper_cartesia_bytes_and_cosyvoice_forms(server: Server) -> None:
    """``input_type`` and ``lexicons`` are fields of Piper's JSON, Cartesia's ``/tts/bytes`` JSON and CosyVoice's
    forms (``lexicons`` comma-separated there), judged by the audio; ``/tts/bytes`` says what was ignored."""
    alias = 'Ask <sub alias="World Wide Web">WWW</sub> now.'

    def piper(**fields: Any) -> np.ndarray:
        response = httpx.post(f"{server.url}/synthesize", json={"seed": 3, **fields}, timeout=60)
        assert response.status_code == 200, response.text
        return parse_wav(response.content)[1]

    def cartesia(transcript: str, **fields: Any) -> httpx.Response:
        body = json.loads(cartesia_request(transcript, **fields))
        return httpx.post(f"{server.url}/tts/bytes", json=body, timeout=60)

    def form(**fields: str) -> httpx.Response:
        return httpx.post(f"{server.url}/inference_sft", data={"format": "pcm", "seed": "2", **fields}, timeout=60)

    def form_pcm(**fields: str) -> np.ndarray:
        response = form(**fields)
        assert response.status_code == 200, response.text
        return np.frombuffer(response.content, "<i2")

    spelled_out = piper(text=ALIAS_SPOKEN)
    assert same_speech(piper(text=alias, input_type="ssml"), spelled_out)
    assert not same_speech(piper(text=alias), spelled_out)
    forced = cartesia(alias, input_type="ssml")
    assert forced.status_code == 200, forced.text
    assert same_speech(np.frombuffer(forced.content, "<i2"), np.frombuffer(cartesia(ALIAS_SPOKEN).content, "<i2"))
    assert cartesia("<speak>Hi <foo>there</foo>.</speak>").headers["x-ssml-ignored"] == "<foo>"
    assert "x-ssml-ignored" not in cartesia("<speak>Hi there.</speak>").headers
    assert same_speech(form_pcm(tts_text=alias, input_type="ssml"), form_pcm(tts_text=ALIAS_SPOKEN))
    text, phonemes = "I like tomato soup.", f"I like [[{POTATO_IPA}]] soup."
    with uploaded_lexicon(server) as lexicon_id:
        with_lexicon = piper(text=text, lexicons=[lexicon_id])
        assert same_speech(with_lexicon, piper(text=phonemes))
        assert not same_speech(with_lexicon, piper(text=text))
        by_form = form_pcm(tts_text=text, lexicons=f"{lexicon_id}, {lexicon_id}")
        assert same_speech(by_form, form_pcm(tts_text=phonemes))
        assert not same_speech(by_form, form_pcm(tts_text=text))
        by_query = httpx.post(
            f"{server.url}/inference_sft?lexicons={lexicon_id}", data={"tts_text": text, "format": "pcm", "seed": "2"}
        )
        assert same_speech(np.frombuffer(by_query.content, "<i2"), by_form)
    for response in (
        httpx.post(f"{server.url}/synthesize", json={"text": text, "lexicons": ["lex_missing"]}),
        cartesia(text, lexicons=["lex_missing"]),
        form(tts_text=text, lexicons="lex_missing"),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "unknown_lexicon" and response.json()["error"]["param"] == "lexicons"
    bad_type = form(tts_text=text, input_type="xml")
    assert bad_type.status_code == 400 and bad_type.json()["error"]["param"] == "input_type"


ALIAS_SPOKEN = "Ask World Wide Web now."


def test_ssml_phonemes_in_ipa_and_arpabet_reach_the_voice(server: Server) -> None:
    ipa = pcm(server, f'<speak>I like <phoneme alphabet="ipa" ph="{POTATO_IPA}">tomato</phoneme> soup.</speak>')
    assert same_speech(ipa, pcm(server, f"I like [[{POTATO_IPA}]] soup."))
    arpabet = "P AH0 T EY1 T OW2"
    spoken = pcm(server, f'<speak>I like <phoneme alphabet="cmu-arpabet" ph="{arpabet}">tomato</phoneme> soup.</speak>')
    assert same_speech(spoken, pcm(server, f"I like [[{arpabet_to_ipa(arpabet).replace(' ', '')}]] soup."))


def test_bad_lexicons_are_refused(server: Server) -> None:
    for body in (b"not xml", b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><lexicon>&e;</lexicon>'):
        response = httpx.post(
            f"{server.url}/v1/lexicons", content=body, headers={"Content-Type": "application/pls+xml"}
        )
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_lexicon", response.text
    wrong = httpx.post(f"{server.url}/v1/lexicons", content=b"{}", headers={"Content-Type": "application/json"})
    assert wrong.status_code == 415


# -- bad and hostile documents ------------------------------------------------------------------------------------

HOSTILE = {
    "malformed": "<speak>unclosed <break time=",
    "mismatched": "<speak><prosody rate='slow'>text</speak>",
    "billion laughs": '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol0 "lol">'
    + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))
    + "]><speak>&lol9;</speak>",
    "external entity": '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    "<speak>&xxe;</speak>",
    "external DTD": '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/evil.dtd"><speak>Hello</speak>',
    "deep nesting": "<speak>" + "<prosody>" * 200 + "deep" + "</prosody>" * 200 + "</speak>",
    "large attribute": '<speak><break time="' + "1" * 1_000_000 + '"/></speak>',
    "long tag": '<speak><break time="' + "1" * 3000 + '"/></speak>',  # within the text limit: the reader's own
}
PAST_THE_TEXT_LIMIT = {"large attribute"}
"""Refused as too long before any reader sees it; over a WebSocket, past the message size (a 1009 close)."""


def test_bad_and_hostile_ssml_gets_a_400_fast_and_disturbs_no_other_stream(server: Server) -> None:
    long_text = " ".join(["A stream that keeps speaking while others are refused."] * 6)
    alone = pcm(server, long_text)
    result: dict[str, np.ndarray] = {}

    def listen() -> None:
        with httpx.stream(
            "POST",
            f"{server.url}/v1/audio/speech",
            json={"model": "tts-1", "input": long_text, "voice": "alloy", "response_format": "pcm", "seed": 7},
            timeout=120,
        ) as response:
            result["pcm"] = np.frombuffer(b"".join(response.iter_bytes()), dtype="<i2")

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        for name, document in HOSTILE.items():
            started = time.monotonic()
            response = speech(server, document)
            elapsed = time.monotonic() - started
            error = response.json()["error"]
            if name in PAST_THE_TEXT_LIMIT:
                refusal = (response.status_code, error["code"])
                assert refusal in ((400, "input_too_long"), (413, "body_too_large")), (name, refusal)
            else:
                assert response.status_code == 400, (name, response.status_code, response.text)
                assert error["code"] == "invalid_ssml", (name, error)
                assert "at character" in error["message"] and error["param"] == "input"
                if name == "long tag":
                    assert "longer than 2048" in error["message"], error
            assert elapsed < 2.0, (name, elapsed)
            assert httpx.get(f"{server.url}/readyz").status_code == 200
    finally:
        listener.join(120)
    assert same_speech(result["pcm"], alone)  # the stream already speaking got all of its audio


# -- rtvoice's WebSocket ------------------------------------------------------------------------------------------


async def ws_utterance(ws: Any) -> tuple[list[dict[str, Any]], np.ndarray]:
    events: list[dict[str, Any]] = []
    audio = bytearray()
    while True:
        message = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(message, bytes):
            audio += message
            continue
        event = json.loads(message)
        events.append(event)
        if event["type"] in ("done", "error"):
            return events, np.frombuffer(bytes(audio), dtype="<i2")


def test_websocket_ssml_in_pieces_breaks_and_marks(server: Server) -> None:
    doc = '<speak>Hello there.<break time="1s"/>Now <mark name="m"/>listen <sub alias="to this">here</sub>.</speak>'

    async def run() -> tuple[list[dict[str, Any]], np.ndarray, list[dict[str, Any]], list[dict[str, Any]]]:
        url = server.url.replace("http://", "ws://") + "/v1/tts/stream"
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE, "seed": 3}))
            assert json.loads(await ws.recv())["type"] == "started"
            for i in range(0, len(doc), 5):  # tags split across pieces
                await ws.send(json.dumps({"type": "text", "text": doc[i : i + 5]}))
            await ws.send(json.dumps({"type": "flush"}))
            events, audio = await ws_utterance(ws)
            # A document that does not read: an error for that utterance; the connection lives on.
            await ws.send(json.dumps({"type": "text", "text": "<speak>Broken <prosody rate='slow'>text"}))
            await ws.send(json.dumps({"type": "flush"}))
            broken, _ = await ws_utterance(ws)
            await ws.send(json.dumps({"type": "text", "text": "Still here."}))
            await ws.send(json.dumps({"type": "end"}))
            after, _ = await ws_utterance(ws)
            return events, audio, broken, after

    events, audio, broken, after = asyncio.run(run())
    assert 0.9 <= longest_silence_s(audio, RATE) <= 1.5
    words = [e for e in events if e["type"] == "word"]
    (mark,) = [e for e in events if e["type"] == "mark"]
    listen = next(w for w in words if w["text"] == "listen")
    assert mark["name"] == "m" and listen["start_s"] <= mark["start_s"] <= listen["end_s"]
    assert "to this" in [w["text"] for w in words]
    assert broken[-1]["type"] == "error" and broken[-1]["code"] == "invalid_ssml"
    assert after[-1]["type"] == "done" and after[-1]["audio_s"] > 0.3


def test_websocket_flush_after_an_ssml_error_ends_the_failed_utterance_quietly(server: Server) -> None:
    """SSML that does not read as it arrives: the error, and the client's ``flush`` that ends that utterance gets
    nothing more; the next text is a new utterance; a flush with nothing pending is then ``empty_input``, as on a
    fresh connection."""

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        url = server.url.replace("http://", "ws://") + "/v1/tts/stream"
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            assert json.loads(await ws.recv())["type"] == "started"
            await ws.send(json.dumps({"type": "text", "text": "<speak>Bad </p> here"}))
            failed, _ = await ws_utterance(ws)
            await ws.send(json.dumps({"type": "flush"}))
            await ws.send(json.dumps({"type": "text", "text": "Still here."}))
            await ws.send(json.dumps({"type": "flush"}))
            after, _ = await ws_utterance(ws)
            await ws.send(json.dumps({"type": "flush"}))
            empty, _ = await ws_utterance(ws)
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            assert json.loads(await ws.recv())["type"] == "started"
            await ws.send(json.dumps({"type": "flush"}))
            fresh, _ = await ws_utterance(ws)
        return failed, after, empty, fresh[-1]

    failed, after, empty, fresh = asyncio.run(run())
    assert [e["type"] for e in failed] == ["error"] and failed[0]["code"] == "invalid_ssml"
    assert not [e for e in after if e["type"] == "error"], after
    assert after[-1]["type"] == "done" and after[-1]["utterance"] == 1 and after[-1]["audio_s"] > 0.3
    assert [(e["type"], e["code"]) for e in empty] == [("error", "empty_input")] == [(fresh["type"], fresh["code"])]


# -- Cartesia's WebSocket: its inline tags, as Pipecat's Cartesia service sends them ------------------------------


CARTESIA_URL = "/tts/websocket?cartesia_version=2025-04-16"


def cartesia_request(transcript: str, last: bool = True, context_id: str = "c", **fields: Any) -> str:
    """A generation request as Pipecat's Cartesia service sends it (with word timestamps)."""
    return json.dumps(
        {
            "model_id": "sonic-3",
            "transcript": transcript,
            "voice": {"mode": "id", "id": "a0e99841-438c-4a64-b679-ae501e7d6091"},
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE},
            "language": "en",
            "context_id": context_id,
            "continue": not last,
            "add_timestamps": True,
            "seed": 5,
            **fields,
        }
    )


async def cartesia_until_done(ws: Any, context_id: str = "c") -> list[dict[str, Any]]:
    """A context's messages, up to its ``done`` or ``error``."""
    messages: list[dict[str, Any]] = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if message["context_id"] != context_id:
            continue
        messages.append(message)
        if message["type"] in ("done", "error"):
            return messages


def cartesia_messages(server: Server, transcripts: list[str], **fields: Any) -> list[dict[str, Any]]:
    """One context's messages for ``transcripts`` sent one after another (continuations)."""

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(server.url.replace("http://", "ws://") + CARTESIA_URL, max_size=None) as ws:
            for index, transcript in enumerate(transcripts):
                await ws.send(cartesia_request(transcript, last=index == len(transcripts) - 1, **fields))
            messages = await cartesia_until_done(ws)
            assert messages[-1]["type"] == "done", messages[-1]
            return messages

    return asyncio.run(run())


def cartesia_pcm(messages: list[dict[str, Any]]) -> np.ndarray:
    return np.frombuffer(b"".join(base64.b64decode(m["data"]) for m in messages if m["type"] == "chunk"), "<i2")


def cartesia_context(server: Server, transcripts: list[str], **fields: Any) -> np.ndarray:
    return cartesia_pcm(cartesia_messages(server, transcripts, max_buffer_delay_ms=0, **fields))


def cartesia_words(messages: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    return [
        word
        for m in messages
        if m["type"] == "timestamps"
        for word in zip(
            m["word_timestamps"]["words"], m["word_timestamps"]["start"], m["word_timestamps"]["end"], strict=True
        )
    ]


def test_cartesia_tags_pause_speed_level_and_spell(server: Server) -> None:
    sentence = "The quick brown fox jumps over the lazy dog near the river bank."
    paused = cartesia_context(
        server, ["The first part is done.<bre", 'ak time="1200ms"/>', "The second part starts now."]
    )
    assert 1.0 <= longest_silence_s(paused, RATE) <= 1.6
    assert not set(heard(paused)) & MARKUP_WORDS
    normal = cartesia_context(server, [sentence])
    faster = cartesia_context(server, ['<speed ratio="1.5"/>', sentence])
    quieter = cartesia_context(server, ['<volume ratio="0.5"/>' + sentence])
    assert 0.55 * speech_s(normal) <= speech_s(faster) <= 0.8 * speech_s(normal)
    assert rms(quieter.astype(np.float32)) / rms(normal.astype(np.float32)) == pytest.approx(0.5, rel=0.05)
    spelled = cartesia_context(server, ["Your code is <spell>ABC</spell>."])
    assert same_speech(spelled, cartesia_context(server, ["Your code is eigh bee see."]))


def test_cartesia_timestamps_are_the_clients_words_without_markup(server: Server) -> None:
    """A word is the client's own token, markup never part of it: a <sub> is its element's text, a <spell>'s
    letters are a word each, an inline break splits nothing; whole or token by token, tags split anywhere."""
    doc = '<speak>Ask <sub alias="World Wide Web">WWW</sub> today. Then <foo>listen</foo> carefully.</speak>'
    cases = {
        "ssml": ([doc], ["Ask", "WWW", "today.", "Then", "listen", "carefully."]),
        "ssml, token by token": (re.findall(r"\S+\s*", doc), ["Ask", "WWW", "today.", "Then", "listen", "carefully."]),
        "ssml, in threes": ([doc[i : i + 3] for i in range(0, len(doc), 3)], None),
        "inline break": (
            ["The first part is done.<bre", 'ak time="1200ms"/>', "The second part starts now."],
            ["The", "first", "part", "is", "done.", "The", "second", "part", "starts", "now."],
        ),
        "spell": (["Your code is <spell>ABC</spell>. Done."], ["Your", "code", "is", "A", "B", "C", "Done."]),
        "spell, token by token": (
            ["Your ", "code ", "is <sp", "ell>A", "BC</sp", "ell>. ", "Done."],
            ["Your", "code", "is", "A", "B", "C", "Done."],
        ),
    }
    for name, (transcripts, expected) in cases.items():
        messages = cartesia_messages(server, transcripts)
        words = [word for word, _, _ in cartesia_words(messages)]
        assert not [w for w in words if set(w) & set('<>=/"')], (name, words)
        if expected is not None:
            assert words == expected, (name, words)
        else:  # split inside words: a word's punctuation in another transcript is not its token's
            assert [w.strip(".") for w in words] == ["Ask", "WWW", "today", "Then", "listen", "carefully"], words
        done = messages[-1]
        assert done["type"] == "done"
        if "ssml" in name:  # what the markup asked for and was not done, in the extension field of ``done``
            assert done["ignored"] == ["<foo>"], done
        else:
            assert "ignored" not in done


def test_cartesia_marks_ride_on_timestamps_messages(server: Server) -> None:
    """A mark is in ``marks`` of the ``timestamps`` message before the chunk that holds it, inside its word; a
    mark after the last word comes in a ``timestamps`` message of its own, with empty word lists."""
    doc = '<speak>Then <mark name="here"/>listen carefully.<mark name="end"/></speak>'
    pieces = ["<speak>Then <ma", 'rk name="here"/>listen ', 'carefully.<mark name="end"/>', "</speak>"]
    for transcripts in ([doc], pieces):
        messages = cartesia_messages(server, transcripts)
        words = cartesia_words(messages)
        marks = [(m, mark) for m in messages if m["type"] == "timestamps" for mark in m.get("marks", [])]
        assert [mark["name"] for _, mark in marks] == ["here", "end"], marks
        (_, here), (last, end) = marks
        assert here["char_start"] == doc.index('<mark name="here"/>')
        _, listen_start, listen_end = words[1]
        assert words[1][0] == "listen" and listen_start <= here["start_s"] <= listen_end
        assert last["word_timestamps"] == {"words": [], "start": [], "end": []}
        assert end["start_s"] >= words[-1][2] - 0.05 and end["char_start"] == doc.index('<mark name="end"/>')
        sent_s = 0.0
        for message in messages:  # each mark is sent before the audio that holds it
            if message["type"] == "chunk":
                sent_s += len(base64.b64decode(message["data"])) / 2 / RATE
            for mark in message.get("marks", []):
                assert sent_s <= mark["start_s"] + 0.02, (mark, sent_s)


def test_cartesia_prosody_rate_and_a_lexicon(server: Server) -> None:
    """On the Cartesia WebSocket too: ``slow`` is at least 15% longer, ``150%`` 20 to 45% shorter; a lexicon named
    in ``lexicons`` changes the phonemes the voice gets; ``input_type`` forces SSML."""
    sentence = "The quick brown fox jumps over the lazy dog near the river bank."
    normal = speech_s(cartesia_context(server, [sentence]))
    slow = speech_s(cartesia_context(server, [f'<speak><prosody rate="slow">{sentence}</prosody></speak>']))
    fast = speech_s(cartesia_context(server, ["<speak>", f'<prosody rate="150%">{sentence}', "</prosody></speak>"]))
    assert slow >= 1.15 * normal, (slow, normal)
    assert 0.55 * normal <= fast <= 0.8 * normal, (fast, normal)
    forced = cartesia_context(server, [f'<prosody rate="slow">{sentence}</prosody>'], input_type="ssml")
    assert speech_s(forced) >= 1.15 * normal
    with uploaded_lexicon(server) as lexicon_id:
        text = "I like tomato soup."
        with_lexicon = cartesia_context(server, [text], lexicons=[lexicon_id])
        assert same_speech(with_lexicon, cartesia_context(server, [f"I like [[{POTATO_IPA}]] soup."]))
        assert not same_speech(with_lexicon, cartesia_context(server, [text]))
        tts_bytes = httpx.post(
            f"{server.url}/tts/bytes",
            json=json.loads(cartesia_request(text, lexicons=[lexicon_id])),
            timeout=60,
        )
        assert tts_bytes.status_code == 200, tts_bytes.text
        assert same_speech(np.frombuffer(tts_bytes.content, "<i2"), with_lexicon)


def test_cartesia_hostile_xml_is_an_error_and_the_socket_lives_on(server: Server) -> None:
    """Every bad or hostile document that fits in a message (billion laughs, external entities, deep nesting, a
    long tag...): an ``error`` for its context within 2 s; the same socket then speaks a new context, and the
    server stays ready."""

    async def run() -> None:
        async with websockets.connect(server.url.replace("http://", "ws://") + CARTESIA_URL, max_size=None) as ws:
            for name in [name for name in HOSTILE if name not in PAST_THE_TEXT_LIMIT]:
                started = time.monotonic()
                await ws.send(cartesia_request(HOSTILE[name], context_id=name))
                (error,) = await cartesia_until_done(ws, name)
                assert time.monotonic() - started < 2.0, name
                assert error["type"] == "error" and error["error_code"] == "invalid_ssml", (name, error)
                assert error["status_code"] == 400 and error["done"] is True
                assert httpx.get(f"{server.url}/readyz").status_code == 200
                await ws.send(cartesia_request("Still speaking.", context_id="after"))
                after = await cartesia_until_done(ws, "after")
                assert after[-1]["type"] == "done" and len(cartesia_pcm(after)) > RATE // 2, name

    asyncio.run(run())


def test_spelled_letters_are_heard_as_letters(server: Server) -> None:
    """The recogniser, choosing between the word and its letters, hears the letters for <say-as
    interpret-as="characters"> (OpenAI's route) and Cartesia's <spell> (its WebSocket), and the word without."""
    for word in ("map", "kid", "dog"):
        choices = [f"your code is {word}", f"your code is {' '.join(word)}"]
        said = pcm(server, f"Your code is {word}.")
        say_as = pcm(server, f'<speak>Your code is <say-as interpret-as="characters">{word}</say-as>.</speak>')
        spelled = cartesia_context(server, [f"Your code is <spell>{word.upper()}</spell>."])
        assert heard_as(to_aligner(said, RATE), choices) == choices[0], word
        assert heard_as(to_aligner(say_as, RATE), choices) == choices[1], word
        assert heard_as(to_aligner(spelled, RATE), choices) == choices[1], word
        assert not set(heard(spelled)) & (MARKUP_WORDS | {"spell"})


# -- WHEP's DataChannel -------------------------------------------------------------------------------------------


def test_whep_datachannel_marks_and_a_leading_break(server: Server) -> None:
    """A break at the start is kept though WHEP trims a voice's own leading silence; a mark leaves with the frame
    of the word after it; SSML that does not read is an error event for that request, and a 400 on ``/speak``."""
    doc = '<speak><break time="1s"/>Then <mark name="go"/>listen carefully.</speak>'

    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            player.send({"type": "tts_request", "text": doc, "request_id": "m"})
            done = await player.event("done", "m")
            mark = await player.event("mark", "m")
            words = [e for e in player.events if e["type"] == "word" and e["request_id"] == "m"]
            listen = next(w for w in words if w["text"] == "listen")
            assert mark["name"] == "go" and listen["start_s"] <= mark["start_s"] <= listen["end_s"]
            assert words[0]["start_s"] >= 1.0 and done["audio_s"] > 1.5
            start = len(player.events)
            player.send({"type": "tts_request", "text": "<speak>Broken <s>text</speak>", "request_id": "b"})
            error = await player.event("error", start=start, timeout=10)
            assert error["code"] == "invalid_ssml" and error["param"] == "text", error
            async with httpx.AsyncClient() as http:  # on ``/speak``: a 400 with the JSON error, nothing spoken
                refused = await http.post(
                    f"{player.session_url}/speak",
                    json={"text": "<speak>Broken <s>text</speak>", "request_id": "r"},
                    headers=player.headers,
                )
            assert refused.status_code == 400, refused.text
            body = refused.json()["error"]
            assert body["code"] == "invalid_ssml" and "at character" in body["message"], body
            assert not [e for e in player.events if e.get("request_id") == "r"]
        finally:
            await player.close()

    asyncio.run(main())


def test_whep_done_says_what_was_ignored(server: Server) -> None:
    """``done`` carries ``ignored`` for a DataChannel request and for a ``/speak`` one (its events go to every
    channel), and leaves it out when nothing was."""

    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            player.send({"type": "tts_request", "text": "<speak>Hello <foo>there</foo>.</speak>", "request_id": "d"})
            assert (await player.event("done", "d"))["ignored"] == ["<foo>"]
            async with httpx.AsyncClient() as http:
                spoken = await http.post(
                    f"{player.session_url}/speak",
                    json={"text": '<speak><prosody pitch="high">Hi</prosody> there.</speak>', "request_id": "s"},
                    headers=player.headers,
                )
            assert spoken.status_code == 202, spoken.text
            assert (await player.event("done", "s"))["ignored"] == ["<prosody pitch>"]
            player.send({"type": "tts_request", "text": "<speak>Nothing to ignore.</speak>", "request_id": "p"})
            assert "ignored" not in await player.event("done", "p")
        finally:
            await player.close()

    asyncio.run(main())


# -- CosyVoice's form API and vendors' documents, heard ------------------------------------------------------------


def test_cosyvoice_form_reads_ssml_and_input_type_forces_it(server: Server) -> None:
    def form_pcm(**fields: str) -> tuple[np.ndarray, int]:
        response = httpx.post(f"{server.url}/inference_sft", data={"format": "pcm", "seed": "2", **fields}, timeout=60)
        assert response.status_code == 200, response.text
        return np.frombuffer(response.content, dtype="<i2"), int(response.headers["x-sample-rate"])

    detected, rate = form_pcm(tts_text='<speak>One moment.<break time="1s"/>Here it is.</speak>')
    assert 0.9 <= longest_silence_s(detected, rate) <= 1.5
    forced, rate = form_pcm(tts_text='One moment.<break time="1s"/>Here it is.', input_type="ssml")
    assert 0.9 <= longest_silence_s(forced, rate) <= 1.5
    bad = httpx.post(f"{server.url}/inference_sft", data={"tts_text": "<speak>One <s>two</speak>"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tts_text"


VENDOR_DOCUMENT = (
    '<?xml version="1.0"?><speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
    'xmlns:mstts="https://www.w3.org/2001/mstts" xml:lang="en-US"><voice name="en-US-AvaNeural">'
    '<mstts:express-as style="cheerful">Good morning everyone.</mstts:express-as> '
    '<amazon:effect name="whispered">The weather is fine today.</amazon:effect>'
    '<break time="700ms"/><google:style name="lively">We will meet at noon.</google:style>'
    '<audio src="https://example.com/chime.mp3">Thank you.<desc>a chime sound</desc></audio></voice></speak>'
)


def test_vendor_markup_is_never_heard(server: Server) -> None:
    """On OpenAI's route, and on Cartesia's WebSocket, whole and token by token."""
    vendor = {"amazon", "effect", "whispered", "express", "style", "cheerful", "lively", "google", "voice", "chime"}
    for route, audio in (
        ("openai", pcm(server, VENDOR_DOCUMENT)),
        ("cartesia", cartesia_context(server, [VENDOR_DOCUMENT])),
        ("cartesia, token by token", cartesia_context(server, re.findall(r"\S+\s*", VENDOR_DOCUMENT))),
    ):
        words = set(heard(audio))
        assert not words & (vendor | MARKUP_WORDS), (route, words)
        assert {"morning", "weather", "meet"} & words, (route, words)  # the speech itself is heard
