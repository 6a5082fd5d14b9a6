"""The server's settings: the engine's (``engine/settings.py``) and what only the server uses: its address and
logs, CORS, WHEP, API keys and quotas, HTTP and WebSocket input limits, the drain, gRPC, Wyoming.

Every field reads from the environment with the ``RTVOICE_`` prefix (and from a
``.env`` file in the working directory); ``.env.example`` documents each one.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from rtvoice.engine.settings import EngineSettings, empty_is_unset


class Settings(EngineSettings):
    # Attribute docstrings become field descriptions (the model config is EngineSettings'): `rtvoice serve --help`
    # shows them.

    # --- Server ------------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    """Address the server listens on (0.0.0.0: every interface)."""
    port: int = 8000
    """Port the server listens on."""
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    """Level of rtvoice's and uvicorn's logs: critical, error, warning, info, debug or trace (access: info)."""
    cors_allow_origins: list[str] = ["*"]
    """Origins allowed to call the API from a browser (JSON list)."""

    # --- WHEP (WebRTC playback; app/whep) -------------------------------------------------------
    whep_ice_servers: list[dict[str, str | bool | list[str]]] = Field(default_factory=list)
    """STUN/TURN servers as JSON: ``[{"urls": ..., "username": ..., "credential": ..., "client_only": ...}]``.

    Each is offered to players in a ``Link: rel="ice-server"`` header and, unless ``client_only``, used by
    the server's own ICE gathering. Empty (the default): host candidates only, no public STUN lookup.
    """
    whep_max_sessions: int = 32
    """WHEP sessions at once; past this, ``POST /whep`` answers 503 with Retry-After."""
    whep_idle_timeout_s: float = 30.0
    """A session not connected and without text (DataChannel, /speak) or PATCH for this long is closed."""
    whep_token: str = ""
    """DEPRECATED (use ``api_keys``): a key, named ``whep-token``, valid on the WHEP routes only; empty means none."""
    whep_max_pending_requests: int = 8
    """Utterances one session may have playing or queued; past this a request is refused (queue_full)."""
    whep_opus_fec: bool = True
    """Opus in-band FEC for players that offer ``useinbandfec=1`` (browsers do), its loss hint following the
    player's receiver reports."""
    whep_red: bool = True
    """RFC 2198 redundancy (``red/48000/2``, the previous packet in each) for players that offer it, while the
    player reports loss."""
    whep_send_loss: float = Field(0.0, ge=0.0, lt=1.0)
    """TEST AND BENCHMARK HOOK, off at 0; never set it in production. This share of each WHEP session's own audio RTP
    packets is dropped at random on the way out (seeded per session by its id; RTCP and retransmissions pass), so a
    player, a browser too, sees real gaps, its receiver reports count them and the session adapts as on a lossy link
    (``app/whep/marker.py``, ``bench/whep_browser_loss.py``)."""

    turn_urls: list[str] = Field(default_factory=list)
    """TURN server URLs (JSON list, e.g. ``["turn:turn.example.com:3478?transport=udp"]``) offered to players with
    short-lived credentials minted per request from ``turn_secret`` (coturn's ``use-auth-secret``)."""
    turn_secret: str = ""
    """The TURN server's shared secret (coturn's ``static-auth-secret``): each WHEP answer's ``Link`` headers carry
    a username ``<expiry>:<session>`` and its HMAC-SHA1 as the credential, never a fixed password."""
    turn_credential_ttl_s: int = Field(3600, ge=60, le=86_400)
    """How long a minted TURN credential stays valid (a session's connection keeps its allocation past it)."""

    # --- Replicas behind a balancer (deploy/, docs/scaling.md) ---------------------------------------
    replica_id: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,62})?$")
    """This replica's name behind a balancer (its HAProxy server name): WHEP session ids start with
    ``<replica_id>~`` so the balancer routes a session's requests to the replica that holds it. Empty: no prefix."""
    public_url: str = Field("", pattern=r"^(https?://[^/\s]+(/[^\s]*)?)?$")
    """This replica's own URL as players reach it (e.g. ``https://rtvoice-2.example.com``): WHEP's ``Location``
    is then absolute on it, so a session's requests go straight to its replica. Empty: a relative ``Location``."""
    agent_port: int | None = Field(None, ge=1, le=65535)
    """Port of an HAProxy agent-check on ``host``: each connection gets ``ready up <room>%`` (the share of the engine's
    admission budget still free, at least 1%), ``drain`` when full, draining or loading; unset (the default): off."""

    # --- Access: API keys and quotas (app/access.py) -------------------------------------------------
    api_keys: str = ""
    """API keys, comma-separated; each ``key`` or ``name:key`` (the name labels metrics and logs, never the key).

    Empty: every route is open. Set: every route but ``/healthz``, ``/readyz``, the page and the API docs needs
    ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (WebSockets also ``?api_key=<key>``)."""
    metrics_require_key: bool = False
    """``/metrics`` needs an API key too (when keys are set); off: it stays open for scrapers."""
    key_max_streams: int = Field(0, ge=0)
    """Per key: requests in flight, WebSocket connections and WHEP sessions at once; 0: no limit. Past it, 429."""
    key_requests_per_minute: int = Field(0, ge=0)
    """Per key: requests (and WebSocket connections, WHEP offers) per minute; 0: no limit. Past it, 429."""

    # --- Input limits (app/limits.py, app/server.py) -------------------------------------------------
    max_body_bytes: int = Field(1_048_576, ge=1024)
    """Largest request body (JSON, forms without files); past it, 413. Also a Wyoming event's largest data or payload
    block (past it, an ``error`` event and the connection closes)."""
    max_upload_bytes: int = Field(52_428_800, ge=1024)
    """Largest multipart body (a prompt recording and its fields); past it, 413."""
    max_form_parts: int = Field(16, ge=1)
    """Most fields and files in one form; past it, 400."""
    body_timeout_s: float = Field(30.0, gt=0)
    """Seconds a request body may take to arrive in full (a slow client holds nothing longer); past it, 408."""
    header_timeout_s: float = Field(10.0, gt=0)
    """Seconds a connection may take to send a request's line and headers; past it, the connection is closed."""
    max_header_bytes: int = Field(16_384, ge=1024)
    """Largest request line plus headers; past it, 431 and the connection is closed."""
    max_connections: int = Field(1000, ge=1)
    """Connections and requests in progress at once (uvicorn's limit_concurrency); past it, 503."""
    ws_max_message_bytes: int = Field(65_536, ge=1024)
    """Largest WebSocket message; past it, the connection closes with 1009 (message too big)."""
    ws_max_connections: int = Field(256, ge=1)
    """WebSocket connections at once; past it, 503 with Retry-After before the upgrade."""
    ws_idle_timeout_s: float = Field(300.0, gt=0)
    """A WebSocket with no message either way for this long is closed (1000, reason ``idle timeout``), unless the
    server still owes it audio it asked for."""
    whep_max_sdp_bytes: int = Field(65_536, ge=1024)
    """Largest WHEP offer (``application/sdp``); past it, 413."""
    whep_max_trickle_bytes: int = Field(16_384, ge=256)
    """Largest trickle-ICE ``PATCH`` body (``application/trickle-ice-sdpfrag``); past it, 413."""
    whep_max_message_bytes: int = Field(65_536, ge=256)
    """Largest DataChannel message; past it, an ``error`` event ``message_too_large``."""

    # --- Shutdown (app/drain.py) ---------------------------------------------------------------------
    drain_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM: /readyz and new requests answer 503 at once; streams in progress get this long to finish
    before WebSockets and WHEP sessions are closed and the process exits."""

    # --- gRPC (CosyVoice's service; app/cosyvoice_grpc) --------------------------------------------
    grpc_port: int | None = Field(None, ge=1, le=65535)
    """Port of CosyVoice's gRPC service (``cosyvoice.CosyVoice/Inference``) on ``host``, served by the same
    process and engine; unset (the default) turns it off. Needs the ``grpc`` extra (grpcio)."""

    # --- Wyoming (Home Assistant's TTS protocol; app/wyoming) -----------------------------------------
    wyoming_uri: str | None = None
    """Serve Wyoming's text-to-speech protocol (Home Assistant's voice pipeline) at ``tcp://HOST:PORT``, e.g.
    ``tcp://0.0.0.0:10200``, from the same process and engine; unset (the default) turns it off.

    Wyoming has no authentication: API keys and quotas do not apply to it. Without a host (``tcp://:10200``) it
    listens on loopback only."""
    wyoming_zeroconf: bool = False
    """Announce the Wyoming server on the local network (mDNS ``_wyoming._tcp.local.``) so Home Assistant discovers
    it; needs ``wyoming_uri`` and the ``zeroconf`` extra. Off by default."""

    @property
    def wyoming_address(self) -> tuple[str, int] | None:
        """Where the Wyoming server listens: ``(host, port)``; None when it is off."""
        return None if self.wyoming_uri is None else tcp_address(self.wyoming_uri)

    @field_validator("wyoming_uri", mode="before")
    @classmethod
    def _wyoming_uri(cls, value: object) -> object:
        value = empty_is_unset(value)
        if isinstance(value, str):
            tcp_address(value.strip())  # ValueError, which pydantic reports, when it does not read
            return value.strip()
        return value

    @model_validator(mode="after")
    def _zeroconf_needs_a_server(self) -> Settings:
        if self.wyoming_zeroconf and self.wyoming_uri is None:
            raise ValueError("RTVOICE_WYOMING_ZEROCONF needs RTVOICE_WYOMING_URI: no Wyoming server to announce")
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("turn_urls")
    @classmethod
    def _turn_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("turn:", "turns:")):
                raise ValueError(f"{url!r} is not a turn: or turns: URL")
        return urls

    @field_validator("grpc_port", "agent_port", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return empty_is_unset(value)


LOOPBACK = "127.0.0.1"


def tcp_address(uri: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` as ``(host, port)``; loopback when the host is left out (``tcp://:10200``). ValueError
    for anything else."""
    parts = urlsplit(uri)
    if parts.scheme != "tcp" or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{uri!r} is not a tcp://HOST:PORT URI (for example tcp://0.0.0.0:10200)")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not 1 <= port <= 65535:
        raise ValueError(f"{uri!r} needs a port from 1 to 65535 (for example tcp://0.0.0.0:10200)")
    return parts.hostname or LOOPBACK, port
