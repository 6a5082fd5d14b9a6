"""What WHEP needs from SDP: checking a player's offer, the Opus FEC and RED it allows and the answer saying so,
and reading trickle-ICE fragments (RFC 8840)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiortc import RTCIceCandidate
from aiortc.sdp import SessionDescription, candidate_from_sdp


class SdpError(ValueError):
    """An offer or fragment the server cannot use; ``code`` names the problem."""

    def __init__(self, message: str, code: str = "invalid_sdp") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Offer:
    sdp: str
    description: SessionDescription
    ice_ufrag: str
    ice_pwd: str
    bundle_mid: str | None
    """The mid whose transport every bundled m-line shares (the first of the BUNDLE group)."""


def _text(body: bytes) -> str:
    # Its size is bounded before it is read: RTVOICE_WHEP_MAX_SDP_BYTES, RTVOICE_WHEP_MAX_TRICKLE_BYTES.
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SdpError(f"the SDP is not UTF-8 text: {error}") from error


def parse_offer(body: bytes) -> Offer:
    """The player's offer, checked: parseable, with an audio m-line the server can send on."""
    text = _text(body)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("v="):
        raise SdpError("the body is not an SDP offer (it must start with 'v=')")
    try:
        description = SessionDescription.parse(text)
    except Exception as error:  # aiortc's parser fails with assertions, value and key errors alike
        raise SdpError(f"the SDP offer is malformed: {error or type(error).__name__}") from error
    audio = [m for m in description.media if m.kind == "audio"]
    if not audio:
        raise SdpError("the offer has no audio m-line; WHEP here plays speech on one audio track", code="no_audio")
    media = audio[0]  # aiortc answers the first audio m-line with the speech track
    if media.direction not in (None, "recvonly", "sendrecv"):
        raise SdpError(
            f"the offer's audio is '{media.direction}'; a player must offer recvonly (or sendrecv)",
            code="invalid_direction",
        )
    if media.port == 0:
        raise SdpError("the offer's audio m-line is rejected (port 0)", code="no_audio")
    if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
        raise SdpError("the offer has no ICE credentials (a=ice-ufrag, a=ice-pwd)")
    bundle = next((g for g in description.group if g.semantic == "BUNDLE" and g.items), None)
    return Offer(
        text, description, media.ice.usernameFragment, media.ice.password, str(bundle.items[0]) if bundle else None
    )


def with_rtcp_mux_only(sdp: str) -> str:
    """WHEP asks for ``a=rtcp-mux-only`` beside ``a=rtcp-mux`` in every bundled RTP m-line; aiortc omits it."""
    lines = sdp.split("\r\n")
    out: list[str] = []
    for line in lines:
        out.append(line)
        if line == "a=rtcp-mux" and "a=rtcp-mux-only" not in lines:
            out.append("a=rtcp-mux-only")
    return "\r\n".join(out)


OPUS_FMTP_FEC = "useinbandfec=1"
RED_RTPMAP = "red/48000/2"


@dataclass(frozen=True)
class AudioCodecs:
    """What the player's offer allows beyond plain Opus on the answered audio m-line."""

    opus_payload_type: int
    fec: bool
    """The offer's Opus ``fmtp`` says ``useinbandfec=1``: the player decodes in-band FEC (RFC 7587)."""
    red_payload_type: int | None
    """The offer's ``red/48000/2`` whose ``fmtp`` names only Opus (``111/111``): RFC 2198 redundancy."""


def audio_codecs(offer: Offer) -> AudioCodecs | None:
    """Opus FEC and RED as the offer's first audio m-line (the one answered) allows them; None without Opus."""
    media = next(m for m in offer.description.media if m.kind == "audio")
    opus = next((c for c in media.rtp.codecs if c.mimeType.lower() == "audio/opus" and c.clockRate == 48000), None)
    if opus is None or opus.payloadType is None:
        return None
    fec = str(opus.parameters.get("useinbandfec", "0")) == "1"
    red = None
    for codec in media.rtp.codecs:
        if codec.mimeType.lower() == "audio/red" and codec.clockRate == 48000 and codec.channels == 2:
            blocks = next(iter(codec.parameters), "")  # aiortc reads "111/111" as a key without value
            if blocks and all(b == str(opus.payloadType) for b in blocks.split("/")):
                red = codec.payloadType
                break
    return AudioCodecs(opus.payloadType, fec, red)


def with_audio_codecs(sdp: str, codecs: AudioCodecs, fec: bool, red: bool) -> str:
    """The answer with Opus's ``useinbandfec=1`` (``fec``) and RED beside Opus (``red``) on its audio m-line.

    aiortc answers Opus alone and without ``fmtp``; the track does FEC and RED itself, so the answer says so.
    """
    red_type = codecs.red_payload_type if red else None
    if not fec and red_type is None:
        return sdp
    opus = str(codecs.opus_payload_type)
    lines = sdp.split("\r\n")
    has_fmtp = any(line.startswith(f"a=fmtp:{opus} ") for line in lines)
    out: list[str] = []
    seen_audio = in_audio = False
    for line in lines:
        if line.startswith("m="):
            in_audio = line.startswith("m=audio ") and not seen_audio  # the first audio m-line: the one answered
            seen_audio = seen_audio or in_audio
            if in_audio and red_type is not None:
                line = f"{line} {red_type}"  # after Opus: Opus stays the preferred payload
        elif in_audio and fec and line.startswith(f"a=fmtp:{opus} ") and OPUS_FMTP_FEC not in line:
            line = f"{line};{OPUS_FMTP_FEC}"
        out.append(line)
        if in_audio and line.startswith(f"a=rtpmap:{opus} "):
            if fec and not has_fmtp:
                out.append(f"a=fmtp:{opus} minptime=10;{OPUS_FMTP_FEC}")
            if red_type is not None:
                out += [f"a=rtpmap:{red_type} {RED_RTPMAP}", f"a=fmtp:{red_type} {opus}/{opus}"]
    return "\r\n".join(out)


@dataclass
class IceFragment:
    """An ``application/trickle-ice-sdpfrag`` body: ICE credentials and candidates by m-section."""

    ufrag: str | None = None
    pwd: str | None = None
    candidates: list[RTCIceCandidate] = field(default_factory=list)
    end_of_candidates: bool = False


def parse_fragment(body: bytes) -> IceFragment:
    """Read a trickle-ICE fragment; ``sdpMid`` of each candidate is its m-section's mid (None if unnamed)."""
    fragment = IceFragment()
    section_mid: list[str | None] = [None]  # index 0: lines before any m= line
    placed: list[tuple[int, RTCIceCandidate]] = []
    for number, raw in enumerate(_text(body).splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if len(line) < 2 or line[1] != "=" or not line[0].isalpha():
            raise SdpError(f"line {number} of the fragment is not an SDP line: {line[:60]!r}")
        if line.startswith("m="):
            section_mid.append(None)
            continue
        if not line.startswith("a="):
            continue
        name, _, value = line[2:].partition(":")
        if name == "mid":
            section_mid[-1] = value.strip()
        elif name == "ice-ufrag":
            fragment.ufrag = fragment.ufrag or value.strip()
        elif name == "ice-pwd":
            fragment.pwd = fragment.pwd or value.strip()
        elif name == "end-of-candidates":
            fragment.end_of_candidates = True
        elif name == "candidate":
            try:
                candidate = candidate_from_sdp(value)
            except (AssertionError, ValueError, IndexError) as error:
                raise SdpError(
                    f"line {number}: malformed candidate {value[:80]!r}", code="invalid_candidate"
                ) from error
            placed.append((len(section_mid) - 1, candidate))
    for section, candidate in placed:
        candidate.sdpMid = section_mid[section]
        fragment.candidates.append(candidate)
    return fragment
