"""What a Piper voice measures of itself at load: the context frames of its chunks (``context.py``), the faster of
its decoder's two layouts (``layout.py``), and the stages whose calls before a stream's first audio finish sooner on
every core.

The contexts follow from the weights, the other two from the machine as well, so none can be a constant; the voice
calls these while it loads, when nothing else runs to skew the timings. Each is kept (``remembered``) under what it
follows from, the machine's processor and cores included for the two timings, so a restart reads it back.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

from rtvoice.engine.durable import key_name, write_atomically
from rtvoice.engine.models.base import StepBudget, StepPayload, SynthesisOptions, VoiceSession
from rtvoice.engine.models.piper import context
from rtvoice.engine.models.piper.prepare import Prepared
from rtvoice.engine.models.piper.stages import PiperGraphs
from rtvoice.engine.models.piper.steps import EncodedSegment, EncodeJob

log = logging.getLogger(__name__)

MEASURING_TEXT = "Warming up the voice, and measuring how long its speech is."
"""What the voice speaks at load: its context frames (``context.py``), its speech per character (warm-up)."""

StageCall = Callable[[Any, onnxruntime.InferenceSession], list[Any]]
"""Runs a batch of one stage's payloads on a given session (``PiperVoice``'s ``_encode``, ``_flow``, ``_decode``)."""


@dataclass(frozen=True)
class SentenceStages:
    """One segment through the stages whole, and a run of each stage on any span ``[lo, hi)`` of its frames."""

    frames: int
    flow: context.RunStage
    latent: np.ndarray
    """The whole flow run: [channels, frames]."""
    decode: context.RunStage
    audio: np.ndarray
    """The whole decoder run: ``frames`` × hop samples."""


def contexts_key(weights_sha256: str, config_bytes: bytes, chunk_frames: int) -> dict[str, Any]:
    """What the measured contexts follow from (``remembered`` keeps them under it): the weights (their hash), the
    config (the phonemes), the measurement, and the libraries that run it."""
    return {
        "weights_sha256": weights_sha256,
        "config_sha256": hashlib.sha256(config_bytes).hexdigest(),
        "version": context.MEASURE_VERSION,
        "tolerance_db": context.TOLERANCE_DB,
        "chunk_frames": chunk_frames,
        "text": MEASURING_TEXT,
        "onnxruntime": onnxruntime.__version__,
        "piper_tts": importlib.metadata.version("piper-tts"),
    }


def timings_key(weights_sha256: str, what: str, threads: int, **more: Any) -> dict[str, Any]:
    """What a timed choice (``what``) follows from: the weights, onnxruntime, the machine's processor and the cores
    this process may use, and the threads the timed sessions run on."""
    return {
        "weights_sha256": weights_sha256,
        "what": what,
        "onnxruntime": onnxruntime.__version__,
        "processor": _processor(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads,
        **more,
    }


@functools.cache  # one machine per process: read once, however many voices load
def _processor() -> str:
    """The processor's model name (Linux's ``/proc/cpuinfo``), else what the platform says of it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def remembered(directory: Path | None, key: dict[str, Any], measure: Callable[[], Any]) -> Any:
    """``measure()`` (a JSON value), or what it gave for the same ``key`` before, kept in ``directory`` (None: keep
    nothing): measuring takes seconds of every start. A file that cannot be read or written is measured again or
    left out."""
    if directory is None:
        return measure()
    path = directory / f"{key_name(key)}.json"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept["key"] == key:
            log.info("%s as measured before (%s): %s", key.get("what", "context frames"), path, kept["value"])
            return kept["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not measured yet, or not readable: measure
    value = measure()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"key": key, "value": value}).encode())  # for a server starting beside
    except OSError as error:
        log.warning("could not keep what was measured in %s: %s", directory, error)
    return value


def least_contexts(
    voice_id: str,
    graphs: PiperGraphs,
    hop: int,
    stages: SentenceStages,
    decoder: onnxruntime.InferenceSession,
    chunk_frames: int,
    threads: int,
) -> tuple[int, int]:
    """Context frames of flow windows and decoder chunks: the least at which ``stages``, a sentence, made in chunks of
    ``chunk_frames`` (the plan's smallest) sounds as its whole run does (``context.py``), at most the reach of the
    stage's convolutions (``graph.context_frames``). The flow's chunks are judged by the audio of the latent they
    make, on ``decoder``. Chunks run on ``threads`` at once (nothing else runs while a voice loads)."""
    from rtvoice.engine.models.piper import graph  # onnx, needed only when measuring (``prepare.py``)

    flow_bound = graph.context_frames(graphs.flow)
    decoder_bound = graph.context_frames(graphs.decoder)
    frames = stages.frames
    with ThreadPoolExecutor(threads, thread_name_prefix="rtvoice-context") as pool:

        def decoded(latent: np.ndarray) -> np.ndarray:
            """The audio of a whole latent, in a piece per thread with the decoder's full reach as context (so the
            pieces join as one run does)."""

            def decode(lo: int, hi: int) -> np.ndarray:
                (audio,) = decoder.run(None, {graphs.latent: latent[None, :, lo:hi]})
                return audio.reshape(-1)

            return context.tiled(decode, frames, hop, -(-frames // threads), decoder_bound, pool.map)

        decoder_context = context.least_context(
            lambda frames_around: context.tiled(stages.decode, frames, hop, chunk_frames, frames_around, pool.map),
            stages.audio,
            decoder_bound,
        )
        flow_context = context.least_context(
            lambda frames_around: decoded(context.tiled(stages.flow, frames, 1, chunk_frames, frames_around, pool.map)),
            decoded(stages.latent),
            flow_bound,
        )
    log.info(
        "voice %s: context frames: flow %d (the graph's reach: %d), decoder %d (%d)",
        voice_id,
        flow_context,
        flow_bound,
        decoder_context,
        decoder_bound,
    )
    return flow_context, decoder_context


def fastest_decoder(
    voice_id: str,
    prepared: Prepared,
    exported: Callable[[], onnxruntime.InferenceSession],
    chunk_size: int,
    options: onnxruntime.SessionOptions,
    providers: list[str],
    *,
    kept: Callable[[dict[str, Any], Callable[[], Any]], Any],
    weights_sha256: str,
) -> tuple[onnxruntime.InferenceSession, bytes]:
    """The decoder as exported (its session from ``exported``), or its 2-D form (``prepared.two_d_decoder``:
    ``layout.py``) when that gives the same audio and is faster here, timed on a chunk of ``chunk_size`` frames (the
    largest the plan makes, context included); with its model. ``kept`` (``remembered`` in a directory) keeps the
    choice under its key, so each session is only made where it is timed or was chosen."""
    graphs, channels = prepared.graphs, prepared.decoder_channels
    if prepared.two_d_decoder is None or channels is None:
        return exported(), graphs.decoder.model
    two_d = prepared.two_d_decoder.model

    def candidate() -> onnxruntime.InferenceSession | None:
        try:
            return onnxruntime.InferenceSession(two_d, options, providers=providers)
        except Exception as error:  # onnxruntime refused the rewrite: keep the export
            log.warning("voice %s: decoder as exported (2-D form failed: %s)", voice_id, error)
            return None

    made: list[onnxruntime.InferenceSession] = []

    def measured() -> str:
        session = candidate()
        if session is None:
            return "as exported"
        made.append(session)
        return _decoder_layout(voice_id, exported(), session, graphs.latent, channels, chunk_size)

    key = timings_key(weights_sha256, "decoder layout", options.intra_op_num_threads, chunk_frames=chunk_size)
    if kept(key, measured) != "2-D":
        return exported(), graphs.decoder.model
    session = made[0] if made else candidate()
    return (exported(), graphs.decoder.model) if session is None else (session, two_d)


def _decoder_layout(
    voice_id: str,
    exported: onnxruntime.InferenceSession,
    candidate: onnxruntime.InferenceSession,
    latent_name: str,
    channels: int,
    chunk_size: int,
) -> str:
    """``2-D`` when ``candidate`` gives the export's audio and is faster on a chunk of ``chunk_size`` frames, else
    ``as exported``."""
    from rtvoice.engine.models.piper import layout  # onnx, needed only when timing (``prepare.py``)

    latent = np.random.default_rng(0).standard_normal((1, channels, chunk_size), dtype=np.float32)
    try:
        comparison = layout.compare(exported, candidate, {latent_name: latent}, repeats=3)
    except Exception as error:  # onnxruntime could not run the rewrite: keep the export
        log.warning("voice %s: decoder as exported (2-D form failed: %s)", voice_id, error)
        return "as exported"
    if not comparison.difference <= 1e-4:  # written so that a NaN difference fails too
        log.warning("voice %s: decoder as exported (2-D form differs)", voice_id)
        return "as exported"
    faster = comparison.two_d_s < comparison.exported_s
    log.info(
        "voice %s: decoder %s (a %d-frame chunk: %.1f ms in 2-D, %.1f ms as exported)",
        voice_id,
        "2-D convolutions" if faster else "as exported",
        chunk_size,
        comparison.two_d_s * 1e3,
        comparison.exported_s * 1e3,
    )
    return "2-D" if faster else "as exported"


def faster_wide_sessions(
    voice_id: str,
    open_session: Callable[[SynthesisOptions], VoiceSession],
    calls: dict[type[StepPayload], StageCall],
    sessions: dict[type[StepPayload], onnxruntime.InferenceSession],
    models: dict[type[StepPayload], bytes],
    options: onnxruntime.SessionOptions,
    providers: list[str],
    *,
    kept: Callable[[dict[str, Any], Callable[[], Any]], Any],
    weights_sha256: str,
    repeats: int = 3,
) -> dict[type[StepPayload], onnxruntime.InferenceSession]:
    """Sessions with ``options`` (on its ``intra_op_num_threads`` cores) for the stages whose calls before a stream's
    first audio they make sooner than ``sessions`` do, with the same results to the bit, timed here on the warm-up
    text's first calls in a session from ``open_session`` (the scheduler lends every core to a lone stream's first
    calls: ``run_wide``). ``calls`` run a stage's payloads on a session; ``models`` are the stages' graphs; ``kept``
    (``remembered`` in a directory) keeps which stages, under their key."""
    threads = options.intra_op_num_threads
    if threads <= 1:
        return {}
    opened: dict[type[StepPayload], onnxruntime.InferenceSession] = {}

    def wide(stage: type[StepPayload]) -> onnxruntime.InferenceSession:
        if stage not in opened:
            opened[stage] = onnxruntime.InferenceSession(models[stage], options, providers)
        return opened[stage]

    digests = sorted(hashlib.sha256(model).hexdigest() for model in models.values())
    key = timings_key(weights_sha256, "first calls on every core", threads, models=digests)
    kinds = kept(key, lambda: _faster_wide(voice_id, open_session, calls, sessions, wide, threads, repeats))
    return {stage: wide(stage) for stage in sessions if stage.kind in kinds}


def _faster_wide(
    voice_id: str,
    open_session: Callable[[SynthesisOptions], VoiceSession],
    calls: dict[type[StepPayload], StageCall],
    sessions: dict[type[StepPayload], onnxruntime.InferenceSession],
    wide_session: Callable[[type[StepPayload]], onnxruntime.InferenceSession],
    threads: int,
    repeats: int,
) -> list[str]:
    """The kinds of the stages whose first calls ``wide_session`` makes sooner than ``sessions``, to the bit."""
    session = open_session(SynthesisOptions(seed=0))
    session.add_segment(MEASURING_TEXT)
    first_audio = StepBudget(call_s=0.0, due_s=None, cost=lambda kind, size: math.inf)
    faster: list[str] = []
    audio = None
    while audio is None and (step := session.plan_step(first_audio)) is not None:
        stage = type(step.payload)
        narrow, wide = sessions[stage], wide_session(stage)
        run = calls[stage]
        result = run([_again(step.payload)], narrow)[0]
        narrow_s = wide_s = math.inf
        for _ in range(repeats):  # alternating, so that a burst of other work slows both
            narrow_s = min(narrow_s, _time_call(run, step.payload, narrow))
            wide_s = min(wide_s, _time_call(run, step.payload, wide))
        same = _same(result, run([_again(step.payload)], wide)[0])
        log.info(
            "voice %s: a first %s call on %d cores: %.1f ms, on one: %.1f ms%s",
            voice_id,
            step.kind,
            threads,
            wide_s * 1e3,
            narrow_s * 1e3,
            "" if same else " (results differ: not used)",
        )
        if same and wide_s < narrow_s:
            faster.append(step.kind)
        audio = session.complete(step, result)
    return faster


def _again(payload: StepPayload) -> StepPayload:
    """``payload`` to run once more with the same result (an encoder pass draws its noise from its generator)."""
    return replace(payload, rng=copy.deepcopy(payload.rng)) if isinstance(payload, EncodeJob) else payload


def _same(a: Any, b: Any) -> bool:
    """Whether two results of a stage are equal to the bit."""
    if isinstance(a, EncodedSegment):
        return (
            a.frames == b.frames
            and a.tokens == b.tokens
            and a.frame_inputs.keys() == b.frame_inputs.keys()
            and all(np.array_equal(a.frame_inputs[name], b.frame_inputs[name]) for name in a.frame_inputs)
        )
    return bool(np.array_equal(a, b))


def _seconds(call: Callable[[], object]) -> float:
    """Wall-clock seconds of one ``call``."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _time_call(run: StageCall, payload: StepPayload, session: onnxruntime.InferenceSession) -> float:
    """Seconds of one ``run`` of ``payload`` on ``session`` (run again with the same result)."""
    return _seconds(lambda: run([_again(payload)], session))
