"""WHEP (draft-ietf-wish-whep) over a real server and a real aiortc player: SDP, trickle ICE, speech, cleanup."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Coroutine, Iterator
from itertools import pairwise
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from rtvoice.app.whep.mediastreams import FRAME_S, FRAME_SAMPLES
from rtvoice.engine.audio.framing import FrameBuffer
from testkit.polling import wait_for, wait_for_async
from testkit.whep_client import SPEECH_RMS, RtpArrival, StunResponder, WhepPlayer
from tests.conftest import Server

SDP = {"Content-Type": "application/sdp"}
FRAG = {"Content-Type": "application/trickle-ice-sdpfrag"}
TOKEN = "s3cret-token"
SHORT = "Hello there, this is rtvoice speaking over WebRTC."
SPEECH_ENERGY_RMS = 0.03
"""RMS of a stretch of real speech at the player: far above silence (and above ``SPEECH_RMS``, one audible frame)."""
NO_MEDIA_WINDOW_S = 0.4
"""How long a connected player is watched for media it must not get before the first text (absence has no
event to wait on)."""
LONG = " ".join(
    [
        "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone",
        "expected a short meeting, but the discussion about the new budget went on for hours.",
    ]
    * 4
)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


async def offer_sdp(audio: bool = True, datachannel: bool = True) -> tuple[RTCPeerConnection, str]:
    """An aiortc offer as a browser player would make it (recvonly audio, a DataChannel)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no public STUN lookup
    if audio:
        pc.addTransceiver("audio", direction="recvonly")
    if datachannel:
        pc.createDataChannel("tts")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def post_offer(url: str, sdp: str, headers: dict[str, str] | None = None, **params: str) -> httpx.Response:
    return httpx.post(f"{url}/whep", content=sdp, headers={**SDP, **(headers or {})}, params=params, timeout=30)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return error


def audio_section(sdp: str) -> str:
    return sdp.split("m=audio", 1)[1].split("\nm=", 1)[0]


def debug(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = httpx.get(f"{url}/debug/whep", headers=headers, timeout=10)
    assert response.status_code == 200
    return response.json()


# -- units: framing (the paced track is in tests/test_whep_track.py) ------------------------------------


def test_frame_buffer_cuts_fixed_frames() -> None:
    framer = FrameBuffer(960)
    assert framer.push(np.arange(500, dtype=np.int16)) == []
    frames = framer.push(np.arange(500, 2500, dtype=np.int16))
    assert [len(f) for f in frames] == [960, 960]
    joined = np.concatenate([*frames, framer.flush()])
    assert np.array_equal(joined[:2500], np.concatenate([np.arange(500), np.arange(500, 2500)]).astype(np.int16))
    assert len(joined) == 2880 and not joined[2500:].any()  # the tail is padded with silence
    assert framer.flush() is None
    framer.push(np.ones(10, dtype=np.int16))
    framer.clear()
    assert framer.flush() is None
    with pytest.raises(ValueError):
        FrameBuffer(0)


# -- session setup: POST, the answer, DELETE ------------------------------------------------------------


def test_post_offer_creates_a_session_with_a_complete_answer(server: Server) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        try:
            start = time.monotonic()
            response = post_offer(server.url, sdp)
            elapsed = time.monotonic() - start
            assert response.status_code == 201, response.text
            assert response.headers["content-type"] == "application/sdp"
            location = response.headers["location"]
            assert re.fullmatch(r"/whep/[0-9a-f]{24}", location)
            assert re.fullmatch(r'"[0-9a-f]+"', response.headers["etag"])  # a strong entity-tag
            assert "link" not in response.headers  # no ICE servers configured
            answer = response.text
            assert answer.startswith("v=0")
            audio = audio_section(answer)
            assert "a=sendonly" in audio and "opus/48000/2" in audio
            assert "a=rtcp-mux\r\na=rtcp-mux-only" in audio
            candidates = re.findall(r"^a=candidate:.* typ (\w+)", audio, flags=re.M)
            assert candidates and set(candidates) == {"host"}  # every candidate, gathered before answering
            assert "a=end-of-candidates" in audio
            assert "m=application" in answer  # the DataChannel
            assert elapsed < 4.0  # no public STUN lookup on a closed network

            session = f"{server.url}{location}"
            assert httpx.get(session, timeout=10).status_code == 204
            deleted = httpx.delete(session, timeout=10)
            assert deleted.status_code == 200
            assert_error(httpx.delete(session, timeout=10), 404, "session_not_found")
            assert_error(httpx.get(session, timeout=10), 404)
            assert_error(httpx.patch(session, content=b"a=end-of-candidates\r\n", headers=FRAG, timeout=10), 404)
        finally:
            await pc.close()

    run(main())


def test_offer_errors(server: Server) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        no_audio_pc, no_audio = await offer_sdp(audio=False)
        sessions_before = set(debug(server.url)["session_ids"])
        try:
            bad_type = httpx.post(f"{server.url}/whep", content=sdp, headers={"Content-Type": "text/plain"})
            assert_error(bad_type, 415, "unsupported_media_type")
            assert bad_type.headers["accept-post"] == "application/sdp"
            assert_error(httpx.post(f"{server.url}/whep", json={"sdp": sdp}), 415)
            assert_error(post_offer(server.url, "hello, I am not SDP"), 400)
            assert_error(post_offer(server.url, "v=0\r\nm=audio banana\r\n"), 400)
            assert_error(post_offer(server.url, sdp.replace("a=ice-ufrag", "a=x-ufrag")), 400)
            assert_error(post_offer(server.url, no_audio), 400, "no_audio")
            sendonly = sdp.replace("a=recvonly", "a=sendonly")
            assert_error(post_offer(server.url, sendonly), 400, "invalid_direction")
            pcmu_only = re.sub(r"m=audio (\d+) (\S+) [\d ]+", r"m=audio \1 \2 0", sdp)
            pcmu_only = "\r\n".join(
                line for line in pcmu_only.split("\r\n") if not re.match(r"a=(rtpmap|fmtp|rtcp-fb):(?!0 )", line)
            )
            assert_error(post_offer(server.url, pcmu_only), 400, "unsupported_codec")
            error = assert_error(post_offer(server.url, sdp, voice="nobody"), 400, "voice_not_found")
            assert error["param"] == "voice"
            assert set(debug(server.url)["session_ids"]) <= sessions_before  # nothing was left half-made
        finally:
            await pc.close()
            await no_audio_pc.close()

    run(main())


# -- speech ---------------------------------------------------------------------------------------------


def assert_talkspurts_marked(rtp: list[RtpArrival], utterances: int, underrun_frames: int = 0) -> None:
    """RTP timestamps advance by whole 20 ms frames; the marker bit is set on the stream's first packet, after
    skipped RTP time (the server's loop was late) and on each utterance's first packet (or where speech resumes
    after an underrun), and on no other."""
    assert rtp and rtp[0].marker == 1
    steps = [b.timestamp - a.timestamp & 0xFFFFFFFF for a, b in pairwise(rtp)]
    assert all(step >= FRAME_SAMPLES and step % FRAME_SAMPLES == 0 for step in steps), steps
    assert [b.sequence_number - a.sequence_number & 0xFFFF for a, b in pairwise(rtp)] == [1] * len(steps)
    assert all(packet.marker for packet, step in zip(rtp[1:], steps, strict=True) if step > FRAME_SAMPLES)
    onsets = sum(1 for packet, step in zip(rtp[1:], steps, strict=True) if step == FRAME_SAMPLES and packet.marker)
    skips = sum(1 for step in steps if step > FRAME_SAMPLES)
    # An onset may coincide with a skip; speech resuming after an underrun begins a talkspurt too.
    assert utterances - skips <= onsets <= utterances + underrun_frames, (onsets, skips, underrun_frames)


def test_datachannel_request_is_heard(server: Server) -> None:
    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            underruns_before = server.metric("rtvoice_whep_underrun_seconds_total")
            await asyncio.sleep(NO_MEDIA_WINDOW_S)
            assert player.rtp == []  # connected, nothing said: media starts with the first text
            sent = player.send(
                {"type": "tts_request", "text": SHORT, "speaker_id": "en_US-joe-medium", "request_id": "r1"}
            )
            first = await player.wait_for_speech(sent)
            accepted = await player.event("accepted", "r1")
            start = await player.event("audio_start", "r1")
            done = await player.event("done", "r1")
            await player.wait_for_media_until(first.at + done["audio_s"])  # the utterance's frames have arrived
            lead_in = player.frames_between(sent, first.at)[:1]
            during = player.frames_between(first.at, first.at + done["audio_s"])
            latency = first.at - sent
            print(
                f"\nWHEP text -> first audible frame at the player: {latency * 1000:.0f} ms "
                f"(server ttfa_ms {start['ttfa_ms']})"
            )
            assert accepted["voice"] == "en_US-joe-medium" and accepted["queue_position"] == 0
            assert lead_in and lead_in[0].rms < 1e-3  # media starts at once, with silence while speech is made
            underrun_frames = round((server.metric("rtvoice_whep_underrun_seconds_total") - underruns_before) / FRAME_S)
            assert_talkspurts_marked(player.rtp, utterances=1, underrun_frames=underrun_frames)
            rms = float(np.sqrt(np.mean([f.rms**2 for f in during])))
            assert rms > SPEECH_ENERGY_RMS
            assert 2.0 < done["audio_s"] < 8.0
            assert 0 <= start["ttfa_ms"] < 5000 and latency < 5.0
            types = [e["type"] for e in player.events]
            words = [e for e in player.events if e["type"] == "word"]
            assert types == ["accepted", "audio_start", *["word"] * len(words), "done"]
            assert [w["text"] for w in words] == SHORT.replace(",", "").replace(".", "").split()
            assert all(SHORT[w["char_start"] : w["char_end"]] == w["text"] and w["request_id"] == "r1" for w in words)
            # Each word leaves with the frame that holds its start: its arrival, counted from audio_start's (the
            # first frame's), is its start in the audio, up to the event loop's jitter on a busy machine, and later
            # by the silence the server sent where its audio ran out (counted by the server itself).
            started_at = player.event_times[types.index("audio_start")]
            arrivals = [t for t, e in zip(player.event_times, player.events, strict=True) if e["type"] == "word"]
            lags = [(at - started_at) - w["start_s"] for at, w in zip(arrivals, words, strict=True)]
            assert all(-0.05 < lag < 0.3 + underrun_frames * FRAME_S for lag in lags), (lags, underrun_frames)
            assert words[-1]["end_s"] <= done["audio_s"] + 0.02
            assert {f.samples for f in player.frames} == {FRAME_SAMPLES}  # 20 ms Opus frames at 48 kHz
        finally:
            await player.close()

    run(main())


def test_speak_route_for_players_without_a_datachannel(server: Server) -> None:
    async def main() -> None:
        player = await WhepPlayer(server.url, datachannel=False).start()
        session = player.session_url
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                sent = time.monotonic()
                response = await http.post(f"{session}/speak", json={"text": SHORT, "voice": "en_US-joe-medium"})
                assert response.status_code == 202, response.text
                body = response.json()
                assert body["request_id"] and body["voice"] == "en_US-joe-medium"
                first = await player.wait_for_speech(sent)
                await player.wait_for_media_until(first.at + 1.0)
                heard = player.frames_between(first.at, first.at + 1.0)
                assert float(np.sqrt(np.mean([f.rms**2 for f in heard]))) > SPEECH_ENERGY_RMS  # the text, spoken
                assert_error(await http.post(f"{session}/speak", content=b"{nope"), 400, "invalid_json")
                assert_error(await http.post(f"{session}/speak", json={"text": "  "}), 400, "empty_input")
                assert_error(await http.post(f"{session}/speak", json={"voice": "x"}), 400, "invalid_value")
                error = assert_error(
                    await http.post(f"{session}/speak", json={"text": "Hi.", "voice": "nobody"}), 400, "voice_not_found"
                )
                assert error["param"] == "voice"
                assert_error(await http.post(f"{server.url}/whep/{'0' * 24}/speak", json={"text": "Hi."}), 404)
                cancelled = await http.delete(f"{session}/speak")
                assert cancelled.status_code == 200 and cancelled.json()["cancelled"] == [body["request_id"]]
        finally:
            await player.close()

    run(main())


def test_cancel_stops_speech_within_a_chunk(server: Server) -> None:
    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            cancelled_before = server.metric("rtvoice_streams_total", {"outcome": "cancelled"})
            sent = player.send({"type": "tts_request", "text": LONG, "request_id": "long"})
            first = await player.wait_for_speech(sent)
            await player.wait_for_media_until(first.at + 1.0)  # a second of it played
            stop = player.send({"type": "cancel"})
            event = await player.event("cancelled", "long")
            assert 0.5 < event["audio_s"] < 10
            # What was played out: the last word whose audio all left, among the words sent as it played.
            heard = [
                {k: v for k, v in e.items() if k not in ("type", "request_id")}
                for e in player.events
                if e["type"] == "word"
            ]
            assert event["last_word"] in heard and event["last_word"]["end_s"] <= event["audio_s"]
            after = heard[heard.index(event["last_word"]) + 1 :]  # started playing, not finished
            assert all(w["end_s"] > event["audio_s"] for w in after), (after, event)
            assert all(w["start_s"] <= event["audio_s"] + 0.02 for w in heard)
            await player.wait_for_media_until(stop + 2.0)  # then two seconds of media after the cancel, to listen to
            speech_after = [f for f in player.frames if f.at > stop and f.rms > SPEECH_RMS]
            tail = (speech_after[-1].at - stop) if speech_after else 0.0
            print(f"\nWHEP barge-in: last audible frame {tail * 1000:.0f} ms after cancel left the player")
            # One 20 ms frame plus the player's jitter buffer; the rest is room for a busy machine's DataChannel and
            # decoding (frames are timed as this client decodes them), well short of the two seconds listened to.
            assert tail < 1.0
            spoken = [f for f in player.frames_between(first.at, stop) if f.rms > SPEECH_RMS]
            assert len(spoken) * FRAME_S > 0.25  # it was speaking when cancelled
            assert "done" not in [e["type"] for e in player.events]
            assert await wait_for_async(
                lambda: server.metric("rtvoice_streams_total", {"outcome": "cancelled"}) >= cancelled_before + 1, 5
            )
            # The session goes on: the next request speaks.
            again = player.send({"type": "tts_request", "text": "And now something short.", "request_id": "next"})
            await player.wait_for_speech(again)
            await player.event("done", "next")
        finally:
            await player.close()

    run(main())


def test_requests_queue_behind_the_one_speaking(server: Server) -> None:
    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            player.send({"type": "tts_request", "text": "First sentence.", "request_id": "a"})
            player.send({"type": "tts_request", "text": "Second sentence.", "request_id": "b"})
            done_b = await player.event("done", "b")
            order = [(e["type"], e.get("request_id")) for e in player.events]
            # Each utterance's words play between its first and last frames.
            assert [step for step in order if step[0] != "word"] == [
                ("accepted", "a"),
                ("accepted", "b"),
                ("audio_start", "a"),
                ("done", "a"),
                ("audio_start", "b"),
                ("done", "b"),
            ]
            for request, words in (("a", ["First", "sentence"]), ("b", ["Second", "sentence"])):
                start, done = order.index(("audio_start", request)), order.index(("done", request))
                assert [e["text"] for e in player.events[start + 1 : done]] == words
            assert [e["queue_position"] for e in player.events if e["type"] == "accepted"] == [0, 1]
            assert done_b["audio_s"] > 0.5
        finally:
            await player.close()

    run(main())


def test_datachannel_errors(server: Server) -> None:
    async def main() -> None:
        player = await WhepPlayer(server.url).start()
        try:
            cases = [
                ("{not json", "invalid_json", None),
                (json.dumps([1, 2]), "invalid_message", None),
                (json.dumps({"type": "sing"}), "unknown_type", "type"),
                (json.dumps({"type": "tts_request"}), "invalid_value", "text"),
                (json.dumps({"type": "tts_request", "text": " "}), "empty_input", "text"),
                (
                    json.dumps({"type": "tts_request", "text": "Hi.", "speaker_id": "nobody"}),
                    "voice_not_found",
                    "speaker_id",
                ),
                (json.dumps({"type": "tts_request", "text": "Hi.", "speed": 9}), "invalid_value", "speed"),
            ]
            for message, code, param in cases:
                start = len(player.events)
                player.send(message)
                error = await player.event("error", start=start, timeout=10)
                assert error["code"] == code and error["message"], (message, error)
                assert error.get("param") == param, (message, error)
            # A session holds at most whep_max_pending_requests (8) utterances.
            start = len(player.events)
            for i in range(9):
                player.send({"type": "tts_request", "text": f"Sentence number {i}.", "request_id": f"q{i}"})
            error = await player.event("error", start=start, timeout=10)
            assert error["code"] == "queue_full" and error["request_id"] == "q8"
            player.send({"type": "cancel"})
            await player.event("cancelled", "q7")
        finally:
            await player.close()

    run(main())


# -- trickle ICE ----------------------------------------------------------------------------------------


def _fragment(offer: str, ufrag: str | None = None, pwd: str | None = None, end: bool = True) -> str:
    """An RFC 8840 fragment of the offer's first m-line: its credentials and candidates."""
    media = offer.split("\r\nm=")[1]
    mid = re.search(r"^a=mid:(\S+)", media, re.M).group(1)  # type: ignore[union-attr]
    ufrag = ufrag or re.search(r"a=ice-ufrag:(\S+)", offer).group(1)  # type: ignore[union-attr]
    pwd = pwd or re.search(r"a=ice-pwd:(\S+)", offer).group(1)  # type: ignore[union-attr]
    lines = [f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}", "m=" + media.split("\r\n")[0], f"a=mid:{mid}"]
    lines += re.findall(r"^a=candidate:.*$", media, re.M)
    if end:
        lines.append("a=end-of-candidates")
    return "\r\n".join(lines) + "\r\n"


def test_trickled_candidates_connect(server: Server) -> None:
    """An offer without candidates, its candidates sent by PATCH afterwards: the session connects."""

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            player = WhepPlayer(server.url, http=http)
            full = await player.offer()
            bare = "\r\n".join(
                line for line in full.split("\r\n") if not line.startswith(("a=candidate:", "a=end-of-candidates"))
            )
            try:
                response = await http.post(f"{server.url}/whep", content=bare, headers=SDP)
                assert response.status_code == 201
                player.location = response.headers["location"]
                session = player.session_url
                # ICE restart: new credentials -> 422, and the session lives on.
                restart = await http.patch(
                    session,
                    content=_fragment(full, "newufrag", "newpassword0123456789abc"),
                    headers={**FRAG, "If-Match": "*"},
                )
                assert_error(restart, 422, "ice_restart_unsupported")
                assert (await http.get(session)).status_code == 204
                assert_error(await http.patch(session, content=_fragment(full), headers=SDP), 415)
                bad = await http.patch(session, content=b"a=candidate:1 1 udp\r\n", headers=FRAG)
                assert_error(bad, 400, "invalid_candidate")
                trickle = await http.patch(
                    session, content=_fragment(full), headers={**FRAG, "If-Match": response.headers["etag"]}
                )
                assert trickle.status_code == 204 and not trickle.content
                assert "etag" not in trickle.headers
                await player.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
                await asyncio.wait_for(player._connected.wait(), 20)
                await asyncio.wait_for(player._channel_open.wait(), 20)
                sent = player.send({"type": "tts_request", "text": "Connected by trickle ICE."})
                await player.wait_for_speech(sent)
            finally:
                await player.close()

    run(main())


# -- HTTP surface: OPTIONS, CORS -------------------------------------------------------------------------


def test_options_and_cors(server: Server) -> None:
    options = httpx.options(f"{server.url}/whep", timeout=10)
    assert options.status_code == 200 and options.headers["accept-post"] == "application/sdp"
    session_options = httpx.options(f"{server.url}/whep/{'0' * 24}", timeout=10)
    assert session_options.status_code == 200
    assert session_options.headers["accept-patch"] == "application/trickle-ice-sdpfrag"

    origin = {"Origin": "https://player.example"}
    preflight = httpx.options(
        f"{server.url}/whep",
        headers={
            **origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
        timeout=10,
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", origin["Origin"])
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert preflight.headers["accept-post"] == "application/sdp"
    exposed = {h.strip().lower() for h in preflight.headers["access-control-expose-headers"].split(",")}
    assert {"location", "etag", "link"} <= exposed
    patch_preflight = httpx.options(
        f"{server.url}/whep/abc", headers={**origin, "Access-Control-Request-Method": "PATCH"}, timeout=10
    )
    methods = patch_preflight.headers["access-control-allow-methods"]
    assert patch_preflight.status_code == 200 and "PATCH" in methods and "DELETE" in methods

    async def main() -> None:
        pc, sdp = await offer_sdp()
        try:
            response = post_offer(server.url, sdp, headers=origin)
            assert response.status_code == 201
            assert response.headers["access-control-allow-origin"] in ("*", origin["Origin"])
            exposed = {h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")}
            assert {"location", "etag", "link"} <= exposed
            assert httpx.delete(f"{server.url}{response.headers['location']}", headers=origin).status_code == 200
        finally:
            await pc.close()

    run(main())


# -- a configured server: ICE servers, token, limits, idle timeout ----------------------------------------

IDLE_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def stun() -> Iterator[StunResponder]:
    responder = StunResponder()
    yield responder
    responder.stop()


@pytest.fixture(scope="module")
def configured(start_server: Any, stun: StunResponder) -> Server:
    ice = [
        {"urls": stun.url},
        {
            "urls": ["turn:turn.example.net:3478?transport=udp"],
            "username": "alice",
            "credential": 'p"w',
            "client_only": True,
        },
    ]
    return start_server(
        whep_ice_servers=json.dumps(ice),
        whep_token=TOKEN,
        whep_max_sessions="2",
        # Long enough for a player to connect (ICE, DTLS, SCTP in Python on both ends) on a loaded machine.
        whep_idle_timeout_s=str(IDLE_TIMEOUT_S),
        max_active_streams="1",
        max_queued_streams="0",
    )


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_ice_servers_are_linked_and_used(configured: Server, stun: StunResponder) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        try:
            requests_before = stun.requests
            response = post_offer(configured.url, sdp, headers=AUTH)
            assert response.status_code == 201, response.text
            links = response.headers.get_list("link")
            assert f'<{stun.url}>; rel="ice-server"' in links
            assert (
                '<turn:turn.example.net:3478?transport=udp>; rel="ice-server"; username="alice"; '
                'credential="p\\"w"; credential-type="password"'
            ) in links
            assert stun.requests > requests_before  # the server gathered with the configured STUN server
            assert "typ srflx" in response.text
            assert httpx.delete(f"{configured.url}{response.headers['location']}", headers=AUTH).status_code == 200
        finally:
            await pc.close()

    run(main())


def test_bearer_token(configured: Server) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        try:
            # RTVOICE_WHEP_TOKEN (deprecated) is an API key for the WHEP routes only.
            for headers, code in (
                ({}, "missing_api_key"),
                ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
                ({"Authorization": f"Basic {TOKEN}"}, "missing_api_key"),
            ):
                denied = post_offer(configured.url, sdp, headers=headers)
                assert_error(denied, 401, code)
                assert denied.headers["www-authenticate"].startswith("Bearer")
            assert httpx.get(f"{configured.url}/voices").status_code == 200  # the other routes stay open
            created = post_offer(configured.url, sdp, headers=AUTH)
            assert created.status_code == 201
            session = f"{configured.url}{created.headers['location']}"
            assert_error(httpx.patch(session, content=b"a=end-of-candidates\r\n", headers=FRAG), 401)
            assert_error(httpx.post(f"{session}/speak", json={"text": "Hi."}), 401)
            assert_error(httpx.delete(session), 401)
            assert_error(httpx.get(f"{configured.url}/debug/whep"), 401)
            assert httpx.options(f"{configured.url}/whep").status_code == 200  # OPTIONS needs no token
            assert httpx.delete(session, headers=AUTH).status_code == 200
        finally:
            await pc.close()

    run(main())


def test_over_capacity_is_503_with_retry_after(configured: Server) -> None:
    async def main() -> None:
        pcs = [await offer_sdp() for _ in range(3)]
        locations = []
        try:
            for _pc, sdp in pcs[:2]:
                response = post_offer(configured.url, sdp, headers=AUTH)
                assert response.status_code == 201
                locations.append(response.headers["location"])
            full = post_offer(configured.url, pcs[2][1], headers=AUTH)
            assert_error(full, 503, "too_many_sessions")
            assert int(full.headers["retry-after"]) >= 1
            assert httpx.delete(f"{configured.url}{locations.pop()}", headers=AUTH).status_code == 200
            again = post_offer(configured.url, pcs[2][1], headers=AUTH)
            assert again.status_code == 201
            locations.append(again.headers["location"])
        finally:
            for location in locations:
                httpx.delete(f"{configured.url}{location}", headers=AUTH)
            for pc, _ in pcs:
                await pc.close()

    run(main())


def test_engine_overload_reaches_the_player(configured: Server) -> None:
    """One engine stream at a time on this server: a second session's request is refused as overloaded."""

    async def main() -> None:
        first = await WhepPlayer(configured.url, token=TOKEN).start()
        second = await WhepPlayer(configured.url, token=TOKEN).start()
        try:
            first.send({"type": "tts_request", "text": LONG, "request_id": "busy"})
            await first.event("accepted", "busy")
            second.send({"type": "tts_request", "text": "Me too.", "request_id": "refused"})
            error = await second.event("error", "refused")
            assert error["code"] == "overloaded" and error["retry_after_s"] >= 1
            async with httpx.AsyncClient(timeout=30, headers=AUTH) as http:
                speak = await http.post(f"{second.session_url}/speak", json={"text": "Me too."})
                assert_error(speak, 503, "overloaded")
                assert int(speak.headers["retry-after"]) >= 1
        finally:
            await first.close()
            await second.close()

    run(main())


def gone(session: str) -> bool:
    return httpx.get(session, headers=AUTH).status_code == 404


def test_idle_sessions_are_closed_and_connected_ones_kept(configured: Server) -> None:
    async def main() -> None:
        pc, sdp = await offer_sdp()
        player = None
        try:
            closed_before = configured.metric("rtvoice_whep_sessions_closed_total", {"reason": "idle_timeout"})
            response = post_offer(configured.url, sdp, headers=AUTH)
            assert response.status_code == 201
            session = f"{configured.url}{response.headers['location']}"
            # Never connected, never spoken to: gone after the idle timeout.
            assert await wait_for_async(lambda: gone(session), 4 * IDLE_TIMEOUT_S)
            assert (
                configured.metric("rtvoice_whep_sessions_closed_total", {"reason": "idle_timeout"}) == closed_before + 1
            )
            # A connected player pulls media all the time: it is not idle. A session offered after it and never
            # connected is closed by the sweep once the timeout has passed for both.
            player = await WhepPlayer(configured.url, token=TOKEN).start()
            later_pc, later_sdp = await offer_sdp()
            later = f"{configured.url}{post_offer(configured.url, later_sdp, headers=AUTH).headers['location']}"
            try:
                assert await wait_for_async(lambda: gone(later), 4 * IDLE_TIMEOUT_S)
            finally:
                await later_pc.close()
            assert httpx.get(player.session_url, headers=AUTH).status_code == 204
        finally:
            await pc.close()
            if player is not None:
                await player.close()

    run(main())


# -- no leaks ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh(start_server: Any) -> Server:
    """A server of its own, so that what is left after a test is that test's doing."""
    return start_server(whep_max_sessions="64", warmup="false")


def test_fifty_sessions_leave_nothing_behind(fresh: Server) -> None:
    """50 sessions connect (some speak); 40 are DELETEd, 10 just hang up. Afterwards nothing is left."""
    server = fresh

    def settled(before: dict[str, Any]) -> bool:
        now = debug(server.url)
        return (
            now["sessions"] == 0
            and now["reserved"] == 0
            and now["peer_connections_open"] == 0
            and now["peer_connections_alive"] == 0
            and now["session_tasks"] == 0
            and now["engine_active_streams"] == 0
            and now["engine_queued_streams"] == 0
            and now["loop_tasks"] <= before["loop_tasks"]
        )

    before = debug(server.url)
    assert before["sessions"] == 0 and before["peer_connections_alive"] == 0
    created_before = server.metric("rtvoice_whep_sessions_created_total")

    async def one(i: int, http: httpx.AsyncClient) -> None:
        player = await WhepPlayer(server.url, http=http).start()
        try:
            if i % 5 == 0:
                player.send({"type": "tts_request", "text": LONG})
                await player.event("audio_start")
        finally:
            if i % 5 == 4:
                await player.close(delete=False)  # hang up without DELETE: the connection's end cleans up
            else:
                response = await player.delete()
                assert response.status_code == 200
                await player.close(delete=False)

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            for batch in range(5):
                await asyncio.gather(*(one(batch * 10 + i, http) for i in range(10)))

    run(main())
    assert server.metric("rtvoice_whep_sessions_created_total") == created_before + 50
    assert wait_for(lambda: settled(before), 20, 0.25), (before, debug(server.url))
    for gauge in ("rtvoice_whep_sessions", "rtvoice_whep_peer_connections", "rtvoice_whep_tasks"):
        assert server.metric(gauge) == 0, gauge
    assert server.metric("rtvoice_active_streams") == 0
