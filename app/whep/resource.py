"""A WHEP session resource: one player's peer connection, its speech track, DataChannels and playback queue.

Created by ``POST /whep`` from the player's offer; changed by ``PATCH`` (trickle
ICE); ended by ``DELETE``, by the peer connection failing or closing, or by the
endpoint's idle sweep. ``close`` is idempotent and frees everything the session
holds: engine streams, its tasks, the track and the peer connection.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel

from rtvoice.app.errors import error_fields
from rtvoice.app.whep.adaptation import PROFILES, LinkMonitor, LinkProfile, ReceiverReport
from rtvoice.app.whep.marker import MarkerBitTransport, SendLoss
from rtvoice.app.whep.mediastreams import SpeechTrack
from rtvoice.app.whep.messages import Cancel, SpeakRequest, event, parse_message
from rtvoice.app.whep.metrics import WhepMetrics
from rtvoice.app.whep.playback_queue import PlaybackQueue, QueuedUtterance
from rtvoice.app.whep.sdp import (
    IceFragment,
    Offer,
    SdpError,
    audio_codecs,
    with_audio_codecs,
    with_rtcp_mux_only,
)
from rtvoice.engine.engine import Engine
from rtvoice.engine.errors import EngineError, InvalidRequest
from rtvoice.engine.models.base import VoiceInfo

log = logging.getLogger(__name__)


class IceRestartUnsupported(Exception):
    """The fragment carries new ICE credentials: an ICE restart, which aiortc cannot do."""


@dataclass(frozen=True)
class SessionContext:
    """What a session needs from the endpoint that creates it, and nothing more (the endpoint builds one)."""

    engine: Engine
    rtc_configuration: RTCConfiguration
    max_pending: int
    """Utterances one session may have playing or queued."""
    max_message_bytes: int
    """Largest DataChannel message."""
    metrics: WhepMetrics
    spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]]
    """Start a task the endpoint tracks (and waits for at shutdown)."""
    on_closed: Callable[[WhepResource, str], None]
    """Told once, with the reason, when the session closes: it is no longer reachable."""
    id_prefix: str = ""
    """What every session id starts with (``<replica_id>~`` behind a balancer, which routes on it)."""
    opus_fec: bool = True
    """Opus in-band FEC for players that offer ``useinbandfec=1``."""
    red: bool = True
    """RFC 2198 redundancy, under loss, for players that offer ``red/48000/2``."""
    send_loss: float = 0.0
    """TEST AND BENCHMARK HOOK (``RTVOICE_WHEP_SEND_LOSS``): the share of the session's audio packets dropped on the
    way out; 0 in production."""


class WhepResource:
    def __init__(self, context: SessionContext, voice: VoiceInfo) -> None:
        self.context = context
        self.id = context.id_prefix + secrets.token_hex(12)
        self.etag = f'"{secrets.token_hex(8)}"'
        """A strong entity-tag for the ICE session; it never changes, as ICE restarts are refused."""
        self.voice = voice
        self.created_at = time.monotonic()
        self.last_activity = self.created_at
        self.closed = False
        self.pc = RTCPeerConnection(context.rtc_configuration)
        self.track = SpeechTrack()
        self.track.on_late = context.metrics.count_late_frames
        self.track.on_underrun = context.metrics.count_underrun
        self.playback = PlaybackQueue(
            context.engine,
            self.track,
            voice,
            self._emit,
            context.max_pending,
            self._spawn,
            context.metrics.count_utterance,
            context.metrics.observe_first_frame,
        )
        self.channels: list[RTCDataChannel] = []
        self.link: LinkMonitor | None = None
        """Follows the player's receiver reports once the answer is out."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._offer: Offer | None = None
        self._closing: asyncio.Task[None] | None = None
        self.on_close: list[Callable[[], None]] = []
        """Run once the session is closed (the API key's stream lease)."""

    # -- offer / answer -----------------------------------------------------------------------------

    async def answer(self, offer: Offer) -> str:
        """Apply the player's offer; return the SDP answer with every server candidate in it."""
        self._offer = offer
        pc = self.pc
        transceiver = pc.addTransceiver(self.track, direction="sendonly")
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        transceiver.setCodecPreferences(opus)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer.sdp, type="offer"))
        except Exception as error:  # aiortc rejects what it cannot negotiate with assorted errors
            message = str(error) or type(error).__name__
            if "send parameters" in message:
                raise SdpError("the offer's audio has no Opus codec", code="unsupported_codec") from error
            raise SdpError(f"the offer cannot be applied: {message}") from error
        if transceiver.mid is None:
            raise SdpError("the offer's audio m-line could not be matched", code="no_audio")
        for other in pc.getTransceivers():
            if other is not transceiver:
                other.direction = "inactive"  # no video, no second audio: nothing is received either
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)
        # The sender's transport is settled now (bundling happens while the offer is applied; no renegotiation).
        sender = transceiver.sender
        loss = SendLoss(self.context.send_loss, self.id) if self.context.send_loss else None
        marking = MarkerBitTransport(sender.transport, self.track, sender._ssrc, loss)
        sender.setTransport(marking)  # type: ignore[arg-type]  # a proxy that forwards to the RTCDtlsTransport
        codecs = audio_codecs(offer)  # aiortc accepted the offer, so it has Opus
        fec = red = False
        if codecs is not None:
            fec = self.context.opus_fec and codecs.fec
            red_types = None
            if self.context.red and codecs.red_payload_type is not None:
                red, red_types = True, (codecs.red_payload_type, codecs.opus_payload_type)
            self.track.negotiated(fec, red_types)
        self._apply_profile(PROFILES[0])
        self.link = LinkMonitor(sender.getStats, self._on_report, self._on_profile)
        self._spawn(self.link.run(), "whep-link")
        if pc.iceGatheringState != "complete":  # aiortc gathers inside setLocalDescription; be sure anyway
            done = asyncio.Event()

            def on_gathering_state() -> None:
                if pc.iceGatheringState == "complete":
                    done.set()

            pc.on("icegatheringstatechange", on_gathering_state)
            if pc.iceGatheringState != "complete":
                await asyncio.wait_for(done.wait(), timeout=10)
        answer_sdp = pc.localDescription.sdp
        if codecs is not None:
            answer_sdp = with_audio_codecs(answer_sdp, codecs, fec=fec, red=red)
        return with_rtcp_mux_only(answer_sdp)

    # -- loss protection ----------------------------------------------------------------------------

    def _apply_profile(self, profile: LinkProfile) -> bool:
        """Tune the track to ``profile``; whether the encoder changes (a new one takes over)."""
        before = self.track.tuning
        self.track.tune(profile.bit_rate, profile.packet_loss_percent, profile.red)
        return self.track.tuning != before

    def _on_report(self, report: ReceiverReport) -> None:
        self.context.metrics.observe_report(report)

    def _on_profile(self, profile: LinkProfile, report: ReceiverReport, smoothed_loss: float) -> None:
        if self._apply_profile(profile):
            self.context.metrics.encoder_switches.inc()
        rtt = "unknown" if report.round_trip_s is None else f"{report.round_trip_s * 1000:.0f} ms"
        log.info(
            "whep session %s: loss %.1f%% (smoothed %.1f%%), jitter %.1f ms, rtt %s -> %s: %d kbit/s, "
            "FEC %s (hint %d%%), RED %s",
            self.id,
            report.fraction_lost * 100,
            smoothed_loss * 100,
            report.jitter_s * 1000,
            rtt,
            profile.name,
            profile.bit_rate // 1000,
            "on" if self.track.fec else "off",
            profile.packet_loss_percent,
            "on" if self.track.red_active else ("off" if self.track.red_payload_types else "not offered"),
        )

    def status(self) -> dict[str, Any]:
        """What the session sends now and what its player last reported (``GET /whep/{id}/status``)."""
        tuning = self.track.tuning
        report = self.link.last_report if self.link else None
        return {
            "profile": self.link.buckets.profile.name if self.link else PROFILES[0].name,
            "bit_rate": tuning.bit_rate,
            "fec": tuning.fec,
            "fec_loss_percent": tuning.packet_loss_percent,
            "red": {"negotiated": self.track.red_payload_types is not None, "active": self.track.red_active},
            "encoder_switches": self.track.encoder_switches,
            "receiver_reports": self.link.reports if self.link else 0,
            "smoothed_loss": self.link.buckets.loss if self.link else 0.0,
            "last_report": None
            if report is None
            else {
                "fraction_lost": report.fraction_lost,
                "jitter_s": report.jitter_s,
                "round_trip_s": report.round_trip_s,
            },
        }

    # -- trickle ICE --------------------------------------------------------------------------------

    async def add_candidates(self, fragment: IceFragment) -> None:
        """Add the player's trickled candidates; raise IceRestartUnsupported for new ICE credentials."""
        assert self._offer is not None
        if (fragment.ufrag is not None and fragment.ufrag != self._offer.ice_ufrag) or (
            fragment.pwd is not None and fragment.pwd != self._offer.ice_pwd
        ):
            raise IceRestartUnsupported()
        self.touch()
        for candidate in fragment.candidates:
            # Under BUNDLE every m-line shares the first one's transport; aiortc only feeds that one.
            candidate.sdpMid = self._offer.bundle_mid or candidate.sdpMid or self._first_mid()
            try:
                await self.pc.addIceCandidate(candidate)
            except Exception as error:  # RFC 8840 / WHEP: silently discard a candidate that cannot be used
                log.debug("session %s: candidate discarded: %s", self.id, error)
        if fragment.end_of_candidates:
            try:
                await self.pc.addIceCandidate(None)
            except Exception as error:
                log.debug("session %s: end-of-candidates failed: %s", self.id, error)

    def _first_mid(self) -> str | None:
        for transceiver in self.pc.getTransceivers():
            if transceiver.mid is not None:
                return transceiver.mid
        return None

    # -- text in, events out ------------------------------------------------------------------------

    def speak(self, request: SpeakRequest, reply_to: RTCDataChannel | None = None) -> QueuedUtterance:
        """Queue an utterance (raises EngineError); an ``accepted`` event goes to where it came from."""
        self.touch()
        utterance = self.playback.submit(request, reply_to)
        self._emit(
            event(
                "accepted",
                request_id=utterance.id,
                voice=utterance.voice.id,
                queue_position=self.playback.queue_position(utterance),
            ),
            reply_to,
        )
        return utterance

    def cancel(self) -> list[QueuedUtterance]:
        self.touch()
        return self.playback.cancel()

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        self.channels.append(channel)
        self.touch()

        @channel.on("message")
        def _message(data: str | bytes) -> None:
            self._on_message(channel, data)

        @channel.on("close")
        def _close() -> None:
            if channel in self.channels:
                self.channels.remove(channel)

    def _on_message(self, channel: RTCDataChannel, data: str | bytes) -> None:
        self.touch()
        request_id = None
        try:
            limit = self.context.max_message_bytes
            if len(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")) > limit:
                raise InvalidRequest(f"the message is larger than {limit} bytes", code="message_too_large")
            message = parse_message(data)
            if isinstance(message, Cancel):
                self.cancel()
                return
            request_id = message.request_id
            self.speak(message, channel)
        except EngineError as error:
            self._emit(event("error", **error_fields(error), request_id=request_id), channel)
        except Exception:  # a bug here must not reach aiortc's SCTP handling
            log.exception("session %s: message handling failed", self.id)
            self._emit(event("error", code="internal_error", message="internal error", request_id=request_id), channel)

    def broadcast(self, text: str) -> None:
        """An event to every open DataChannel of the session."""
        self._emit(text, None)

    def _emit(self, text: str, channel: object | None) -> None:
        targets = [channel] if channel is not None else list(self.channels)
        for target in targets:
            if isinstance(target, RTCDataChannel) and target.readyState == "open":
                try:
                    target.send(text)
                except Exception as error:  # a channel closing under us
                    log.debug("session %s: event not sent: %s", self.id, error)

    # -- lifetime -----------------------------------------------------------------------------------

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def idle_for(self, now: float) -> float:
        """Seconds since the last text or PATCH; 0 while connected (a vanished player's connection fails within
        about 30 s, ICE consent, and closes the session)."""
        if self.pc.connectionState == "connected":
            return 0.0
        return now - self.last_activity

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = self.context.spawn(coroutine, f"{name}-{self.id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state in ("failed", "closed") and not self.closed:
            self.close_soon(f"connection_{state}")

    def close_soon(self, reason: str) -> None:
        """Close from a callback: the work runs in a task the endpoint tracks (``context.spawn``)."""
        if self._closing is None and not self.closed:
            self._closing = self.context.spawn(self.close(reason), f"whep-close-{self.id[:8]}")

    async def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.context.on_closed(self, reason)
        self.playback.close()
        for task in list(self._tasks):
            task.cancel()
        self.track.stop()
        for channel in list(self.channels):
            channel.close()
        self.channels.clear()
        try:
            await self.pc.close()
        except Exception:
            log.exception("session %s: closing the peer connection failed", self.id)
        self.pc.remove_all_listeners()
        for callback in self.on_close:
            callback()
        log.info("whep session %s closed (%s)", self.id, reason)
