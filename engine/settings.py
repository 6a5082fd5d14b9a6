"""The engine's settings: voices, text and stream limits, chunking, scheduling, CosyVoice2.

Every field reads from the environment with the ``RTVOICE_`` prefix (and from a
``.env`` file in the working directory); ``.env.example`` documents each one. The
server's own (address, CORS, WHEP, keys, HTTP limits, drain, gRPC) extend these in
``app/settings.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

OPENAI_VOICE_NAMES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


def empty_is_unset(value: object) -> object:
    """A blank value means "not set": ``RTVOICE_COSYVOICE_DIR=`` (as in a copied .env) is not the working
    directory, nor ``RTVOICE_GRPC_PORT=`` a port."""
    return None if isinstance(value, str) and not value.strip() else value


class EngineSettings(BaseSettings):
    # Attribute docstrings become field descriptions: `rtvoice serve --help` shows them.
    model_config = SettingsConfigDict(
        env_prefix="RTVOICE_", env_file=".env", extra="ignore", use_attribute_docstrings=True
    )

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

    # SSML and pronunciation (engine/ssml.py, engine/lexicon.py)
    ssml_max_break_s: float = 10.0
    """Longest silence one ``<break>`` makes (Polly's cap); a longer one is cut to this."""
    ssml_max_silence_s: float = 60.0
    """Longest silence all of one request's breaks make together."""
    lexicons: str = ""
    """W3C PLS lexicon files read at start, comma-separated; each applies to the voices of its ``xml:lang``
    (every voice when it has none), after a request's own. Uploaded lexicons live in ``<data_dir>/lexicons``."""

    # Streaming
    first_chunk_ms: int = 120
    """Audio in a stream's first chunk: small, so the first bytes leave early."""
    chunk_ms: int = 1000
    """Most audio in one later chunk: chunks grow up to this as far as measured costs allow without another listener
    running out of audio. Larger pays the per-call overhead more rarely (more audio per second at full load);
    smaller lets a burst of new streams start sooner (each needs less audio buffered before the next one starts)."""
    flow_chunk_ms: int = 3000
    """Most audio covered by one run of the flow (its context is paid once per run); sized like chunks."""
    crossfade_ms: float = 12.0
    """Overlap between neighbouring chunks, joined with a Hamming cross-fade."""
    first_segment_max_chars: int = 90
    """The first segment is split at a clause or word boundary past this length (time to first audio)."""
    first_segment_clause_chars: int = Field(default=24, ge=0)
    """The first segment also ends at its first clause boundary (a comma, semicolon or colon and a blank) past this
    many characters, so that its encoder pass, which its first audio waits for, is short (0: only at sentence ends
    and ``first_segment_max_chars``)."""
    segment_max_chars: int = 300
    """Later segments are split at a clause or word boundary past this length."""

    # Scheduling and threads
    max_batch_size: int = 8
    """Most steps of one kind that share a model call (a voice may allow fewer; 1 turns batching off)."""
    max_load: float = Field(0.9, gt=0)
    """Admit a new stream only while, by measured costs, it and the admitted streams need at most this share of the
    runner slots' time before their listeners run out (divided by how far recent calls overran their estimates, at
    their 90th percentile); past it, new streams wait in the queue. Below 1 keeps slack for a machine that wavers."""
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
    calibrated at start (no warm-up) or of a kind not measured yet, and of each calibration call at start-up (one
    that hangs stops the start)."""
    runner_threads: int = 2
    """Model calls that run at once."""
    intra_op_threads: int = 1
    """onnxruntime threads inside one model call."""
    idle_cores_for_first_audio: bool = True
    """A stream's calls before its first audio run on every core of the runner (all its slots held) when nothing
    else runs or waits, for the kinds of call its voice measured to finish sooner that way with the same result
    (``Voice.wide_kinds``): a lone request's time to first audio, from cores that would idle."""
    piper_int8: Literal["auto", "on", "off"] = "off"
    """int8 for a Piper voice's text-encoder convolutions and its decoder's first two stages (faster first audio and
    more audio per second on a CPU): ``auto`` takes each part that a quality gate against fp32 passes when the voice
    first loads (the build and its verdict are kept in ``<data_dir>/int8``; the recogniser it judges words with is the
    ``int8`` extra, without which ``auto`` stays fp32 and builds nothing), ``on`` takes both whatever the gate says,
    ``off`` (the default: the gate rejects the embedded voice, and a build costs minutes at a first start; see
    docs/decisions.md) builds nothing."""

    # --- Test hook (engine/faults.py) ----------------------------------------------------------------
    fault_injection: str = ""
    """TEST HOOK, off when empty; never set it in production. ``kind:marker`` pairs, comma-separated: a model call
    of step ``kind`` (e.g. ``decode``, ``encode``, ``lm``) raises when a stream in it is working on a sentence
    containing ``marker``."""

    # --- CosyVoice2 (engine/models/cosyvoice2) ----------------------------------------------------
    cosyvoice_dir: Path | None = None
    """A CosyVoice2 model directory (e.g. CosyVoice2-0.5B); when set, it loads beside the Piper voices.

    Needs the ``cosyvoice`` extra (torch, transformers, ...). Its ``spk2info.pt`` speakers become voices
    ``cosyvoice2-<speaker>``; with ``speech_tokenizer_v2.onnx`` and ``campplus.onnx`` present, the
    zero-shot, cross-lingual and instruct2 routes and voice registration work too.
    """
    data_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "rtvoice"
    )
    """Where rtvoice keeps what it writes (registered voices, uploaded lexicons; for each Piper voice's weights, what
    a start made and later starts read back: its split stages under ``stages/``, what it measured and timed under
    ``measured/``, int8 parts under ``int8/``); never inside a model directory."""
    cosyvoice_voices_dir: Path | None = None
    """Registered CosyVoice2 voices (``<id>.pt`` each); empty means ``<data_dir>/voices``."""
    cosyvoice_threads: int = 1
    """torch threads inside one CosyVoice2 call (``torch.set_num_threads``); runner threads run calls side by side."""
    cosyvoice_device: str = "cpu"
    """torch device for CosyVoice2: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (cuda when available)."""

    @field_validator("cosyvoice_dir", "cosyvoice_voices_dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return empty_is_unset(value)

    @property
    def cosyvoice_voices_path(self) -> Path:
        return self.cosyvoice_voices_dir or self.data_dir / "voices"

    def wide_call_threads(self) -> int:
        """Threads of a call that holds every runner slot (``idle_cores_for_first_audio``): the runner's cores, at
        most the machine's; 1 when the setting is off."""
        if not self.idle_cores_for_first_audio:
            return 1
        return max(1, min(self.runner_threads * self.intra_op_threads, os.cpu_count() or 1))

    # --- CosyVoice2 at scale (engine/models/cosyvoice2: batching, TensorRT) ------------------------
    cosyvoice_estimator: str = "auto"
    """What runs the flow's estimator: ``torch``, ``trt-fp16``, ``trt-fp32``, or ``auto`` (TensorRT fp16
    when CUDA and the ``trt`` extra are there and its output checks out against fp32, else fp32, else
    torch). Engines are built once per GPU, TensorRT version and precision and cached in
    ``<model dir>/trt`` (``<data_dir>/trt`` when the model directory is read-only)."""
    cosyvoice_token2wav_batch: int = 0
    """Most token-to-wave chunks (streams) in one flow call; 0 means 1 on a CPU (where batching does
    not pay) and 8 on a GPU. The TensorRT engine's profile covers twice this many rows (CFG)."""
    cosyvoice_cuda_graphs: bool = True
    """The LM's decode step captured as CUDA graphs (one per batch bucket 1/2/4/8/16/32 and length bucket, at
    warm-up) and replayed: on by default on CUDA; ignored on the CPU, which runs it eagerly."""

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
