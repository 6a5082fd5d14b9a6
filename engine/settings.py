"""All of rtvoice's settings, in one place.

Every field reads from the environment with the ``RTVOICE_`` prefix (and from a
``.env`` file in the working directory); ``.env.example`` documents each one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

OPENAI_VOICE_NAMES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)


class Settings(BaseSettings):
    # Attribute docstrings become field descriptions: `rtvoice serve --help` shows them.
    model_config = SettingsConfigDict(env_prefix="RTVOICE_", env_file=".env", extra="ignore",
                                      use_attribute_docstrings=True)

    # Server
    host: str = "127.0.0.1"
    """Address the server listens on (0.0.0.0: every interface)."""
    port: int = 8000
    """Port the server listens on."""
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    """Level of rtvoice's and uvicorn's logs: critical, error, warning, info, debug or trace (access: info)."""
    cors_allow_origins: list[str] = ["*"]
    """Origins allowed to call the API from a browser (JSON list)."""

    # Voices
    default_voice: str = ""
    """Voice id used when a request names none; empty means the embedded voice."""
    voices_dir: Path | None = None
    """Directory of extra Piper voices (``*.onnx`` with ``*.onnx.json`` beside each)."""
    openai_voice_map: dict[str, str] = Field(default_factory=dict)
    """OpenAI voice name (or any alias) -> voice id, as JSON; OpenAI names not listed speak with the default voice."""
    warmup: bool = True
    """Run every voice once at start-up so the first request does not pay for it."""

    # Limits
    max_text_chars: int = 4096
    """Longest text one request may carry, in characters."""
    max_active_streams: int = 32
    """Streams synthesising at once; more wait in the queue."""
    max_queued_streams: int = 64
    """Streams waiting for a slot; past this, requests get 503."""
    max_buffered_audio_s: float = 20.0
    """Audio a stream may produce ahead of what its client has taken."""

    # Streaming
    first_chunk_ms: int = 120
    """Audio in a stream's first chunk: small, so the first bytes leave early."""
    chunk_ms: int = 1000
    """Most audio in one later chunk. Chunks are as large as measured costs allow without another listener
    running out of audio, up to this; larger ones pay the per-call overhead more rarely."""
    flow_chunk_ms: int = 3000
    """Most audio covered by one run of the flow (its context is paid once per run); sized like chunks."""
    crossfade_ms: float = 12.0
    """Overlap between neighbouring chunks, joined with a Hamming cross-fade."""
    first_segment_max_chars: int = 90
    """The first segment is split at a clause or word boundary past this length (time to first audio)."""
    segment_max_chars: int = 300
    """Later segments are split at a clause or word boundary past this length."""

    # Scheduling and threads
    max_batch_size: int = 8
    """Most steps of one kind that share a model call (a voice may allow fewer; 1 turns batching off)."""
    max_load: float = Field(0.9, gt=0)
    """Admit a new stream only while the demand of the admitted ones, the newcomer's included, stays within
    this share of the capacity measured on this machine; past it, new streams wait in the queue."""
    cost_safety_factor: float = Field(1.5, ge=1.0)
    """Measured call costs are multiplied by this wherever they decide whether a listener is served in time (or by
    how much longer than estimated calls have lately taken, their 90th percentile, when that is more)."""
    model_cost_scale: float = Field(1.0, ge=1.0)
    """Test and benchmark hook: each model call holds its runner slot this many times its measured time,
    as on a slower machine (2: half the speed)."""
    model_call_deadline_factor: float = Field(10.0, gt=1.0)
    """A model call running this many times longer than it may plausibly take (its estimate with the margin above,
    or the longest recent call of its voice when that is more) is abandoned: its streams fail and its runner slot
    is freed at once."""
    model_call_deadline_max_s: float = Field(60.0, gt=0)
    """No model call runs longer than this before it is abandoned; also the deadline of every call of a voice not
    calibrated at start (no warm-up) or of a kind not measured yet, and of each calibration call at start-up (one that hangs stops the start)."""
    runner_threads: int = 2
    """Model calls that run at once."""
    intra_op_threads: int = 1
    """onnxruntime threads inside one model call."""

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
    """Largest request body (JSON, forms without files); past it, 413."""
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
    """A WebSocket with no message either way for this long is closed (1000, reason ``idle timeout``)."""
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

    # --- Test hook (engine/faults.py) ----------------------------------------------------------------
    fault_injection: str = ""
    """TEST HOOK, off when empty; never set it in production. ``kind:marker`` pairs, comma-separated: a model call
    of step ``kind`` (e.g. ``decode``, ``encode``, ``lm``) raises when a stream in it is working on a sentence
    containing ``marker``."""

    # --- gRPC (CosyVoice's service; app/cosyvoice_grpc) --------------------------------------------
    grpc_port: int | None = Field(None, ge=1, le=65535)
    """Port of CosyVoice's gRPC service (``cosyvoice.CosyVoice/Inference``) on ``host``, served by the same
    process and engine; unset (the default) turns it off. Needs the ``grpc`` extra (grpcio)."""

    # --- CosyVoice2 (engine/models/cosyvoice2) ----------------------------------------------------
    cosyvoice_dir: Path | None = None
    """A CosyVoice2 model directory (e.g. CosyVoice2-0.5B); when set, it loads beside the Piper voices.

    Needs the ``cosyvoice`` extra (torch, transformers, ...). Its ``spk2info.pt`` speakers become voices
    ``cosyvoice2-<speaker>``; with ``speech_tokenizer_v2.onnx`` and ``campplus.onnx`` present, the
    zero-shot, cross-lingual and instruct2 routes and voice registration work too.
    """
    data_dir: Path = Field(default_factory=lambda: Path(
        os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "rtvoice")
    """Where rtvoice keeps what it writes (registered voices); never inside a model directory."""
    cosyvoice_voices_dir: Path | None = None
    """Registered CosyVoice2 voices (``<id>.pt`` each); empty means ``<data_dir>/voices``."""
    cosyvoice_threads: int = 1
    """torch threads inside one CosyVoice2 call (``torch.set_num_threads``); runner threads run calls side by side."""
    cosyvoice_device: str = "cpu"
    """torch device for CosyVoice2: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (cuda when available)."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("cosyvoice_dir", "cosyvoice_voices_dir", "grpc_port", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # ``RTVOICE_COSYVOICE_DIR=`` (as in a copied .env) means "not set", not the working directory.
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def cosyvoice_voices_path(self) -> Path:
        return self.cosyvoice_voices_dir or self.data_dir / "voices"

    # --- CosyVoice2 at scale (engine/models/cosyvoice2: batching, TensorRT) ------------------------
    cosyvoice_estimator: str = "auto"
    """What runs the flow's estimator: ``torch``, ``trt-fp16``, ``trt-fp32``, or ``auto`` (TensorRT fp16
    when CUDA and the ``trt`` extra are there and its output checks out against fp32, else fp32, else
    torch). Engines are built once per GPU, TensorRT version and precision and cached in
    ``<model dir>/trt`` (``<data_dir>/trt`` when the model directory is read-only)."""
    cosyvoice_token2wav_batch: int = 0
    """Most token-to-wave chunks (streams) in one flow call; 0 means 1 on a CPU (where batching does
    not pay) and 8 on a GPU. The TensorRT engine's profile covers twice this many rows (CFG)."""

    @field_validator("fault_injection")
    @classmethod
    def _known_faults(cls, value: str) -> str:
        from rtvoice.engine.faults import parse_faults

        parse_faults(value)  # ValueError names the bad item
        return value

    @field_validator("cosyvoice_estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        value = value.strip().lower()
        if value not in ("torch", "trt-fp16", "trt-fp32", "auto"):
            raise ValueError("cosyvoice_estimator must be torch, trt-fp16, trt-fp32 or auto")
        return value
