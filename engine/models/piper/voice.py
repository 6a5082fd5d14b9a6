"""Piper voices, streamed below sentence level.

A segment runs through three stages (see ``graph.py``): one encoder pass gives
its frame-level prior; the flow turns windows of it into latent frames; the
decoder turns chunks of latent into audio. Each flow window and decoder chunk
carries enough context frames on both sides (measured at load, ``context.py``)
that the joined chunks match a whole-segment decode; neighbouring chunks also
overlap by a few samples, joined with a Hamming cross-fade.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
from piper.config import PiperConfig
from piper.voice import PiperVoice as PiperPhonemizer

from rtvoice.engine.audio.pcm import hamming_crossfade
from rtvoice.engine.models.base import (
    MAX_SPEED,
    MIN_SPEED,
    CostEstimate,
    SegmentTimings,
    SpokenTiming,
    StartCost,
    Step,
    StepBudget,
    StepPayload,
    SynthesisOptions,
    Voice,
    VoiceInfo,
    VoiceSession,
)
from rtvoice.engine.models.piper import alignment, context, graph, layout
from rtvoice.engine.models.piper.plan import ChunkPlan, DecodeChunk, FlowWindow, Geometry, Planner, Progress
from rtvoice.engine.text import spoken_tokens

log = logging.getLogger(__name__)

MEASURING_TEXT = "Warming up the voice, and measuring how long its speech is."
"""What the voice speaks at load: its context frames (``context.py``), its speech per character (warm-up)."""
TYPICAL_SEGMENT_CHARS = 100
"""A segment of this many characters stands for all in the steady-cost estimate (encoder cost per character
falls slightly with length)."""


@dataclass
class EncodeJob(StepPayload):
    """A segment through the encoder: phonemes to its frame-level prior (batchable across streams)."""

    kind = "encode"
    text: str
    rng: np.random.Generator
    length_scale: float
    noise_scale: float
    noise_w: float


@dataclass
class EncodedSegment:
    frames: int
    frame_inputs: dict[str, np.ndarray]
    """Flow inputs of this segment: [C, T] arrays, scalars as they are."""
    tokens: tuple[SpokenTiming, ...] | None = None
    """When each token of the text is heard, from the encoder's durations; None when the ids could not be
    traced to phonemes (a phonemiser with ids of its own)."""


@dataclass
class FlowJob(StepPayload):
    """A window of frames through the flow: prior to latent."""

    kind = FlowWindow.kind
    inputs: dict[str, np.ndarray]
    keep_from: int
    keep_frames: int


@dataclass
class DecodeJob(StepPayload):
    """A chunk of latent through the decoder: audio."""

    kind = DecodeChunk.kind
    latent: np.ndarray
    start: int
    """First latent frame in ``latent`` (left context included)."""
    end: int
    """Frame where this chunk's final audio stops; a cross-fade tail follows it."""


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


PiperPayload = EncodeJob | FlowJob | DecodeJob
PiperStep = Step[PiperPayload]


@dataclass
class _Segment:
    text: str
    frames: int = -1
    frame_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    latent: np.ndarray | None = None
    flowed: int = 0
    decoded: int = 0
    tail: np.ndarray | None = None

    @property
    def progress(self) -> Progress:
        return Progress(self.frames, self.flowed, self.decoded)


def _session_options(intra_op_threads: int) -> onnxruntime.SessionOptions:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    # Spinning worker threads would burn the cores that other runners need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class PiperVoice(Voice):
    def __init__(
        self,
        model_path: Path,
        voice_id: str | None = None,
        plan: ChunkPlan | None = None,
        intra_op_threads: int = 1,
        wide_threads: int = 1,
        measured_dir: Path | None = None,
    ) -> None:
        """``wide_threads``: the cores a call may use when the runner lends it every slot (``run_wide``);
        ``measured_dir``: where the context frames measured for these weights are kept (None: measured each time)."""
        plan = plan or ChunkPlan()
        model_path = Path(model_path)
        config_path = Path(f"{model_path}.json")
        if not config_path.exists():
            raise FileNotFoundError(f"voice config {config_path} is missing")
        config_bytes = config_path.read_bytes()
        config_dict = json.loads(config_bytes.decode("utf-8"))
        self.config = PiperConfig.from_dict(config_dict)
        language = config_dict.get("language", {}).get("code") or self.config.espeak_voice
        name = model_path.name.removesuffix(".onnx")
        self.info = VoiceInfo(
            id=voice_id or name,
            name=name,
            language=language,
            sample_rate=self.config.sample_rate,
            model="piper",
            description=f"Piper voice {name} ({config_dict.get('audio', {}).get('quality', 'unknown')} quality)",
            length_scale=float(self.config.length_scale or 1.0),
        )
        self.hop = self.config.hop_length
        # piper-tts's own phonemiser (espeak-ng and friends); its ONNX session is ours, not its.
        self.phonemizer = PiperPhonemizer(session=None, config=self.config)  # type: ignore[arg-type]

        model_bytes = model_path.read_bytes()
        model = onnx.load_from_string(model_bytes)
        self.graphs = graph.split(model)
        self.duration_noise_channels = [graph.noise_channels(model, name) for name in self.graphs.duration_noise]
        del model
        options = _session_options(intra_op_threads)
        providers = ["CPUExecutionProvider"]
        self.encoder = onnxruntime.InferenceSession(self.graphs.encoder.model, options, providers=providers)
        self.flow = onnxruntime.InferenceSession(self.graphs.flow.model, options, providers=providers)
        exported_decoder = onnxruntime.InferenceSession(self.graphs.decoder.model, options, providers=providers)
        frame_ms = 1000 * self.hop / self.info.sample_rate
        chunk_frames = plan.first_chunk_frames(frame_ms)
        # What the measured contexts follow from: the weights, the config (the phonemes), the measurement, and the
        # libraries that run it.
        measure = {
            "weights_sha256": hashlib.sha256(model_bytes).hexdigest(),
            "config_sha256": hashlib.sha256(config_bytes).hexdigest(),
            "version": context.MEASURE_VERSION,
            "tolerance_db": context.TOLERANCE_DB,
            "chunk_frames": chunk_frames,
            "text": MEASURING_TEXT,
            "onnxruntime": onnxruntime.__version__,
            "piper_tts": importlib.metadata.version("piper-tts"),
        }
        del model_bytes
        self.flow_context, self.decoder_context = context.remembered(
            measured_dir, measure, lambda: self._least_contexts(exported_decoder, chunk_frames, max(1, wide_threads))
        )
        self.geometry = Geometry.of(plan, frame_ms, self.flow_context, self.decoder_context)
        self.planner = Planner(self.geometry)
        self.decoder, decoder_model = self._fastest_decoder(exported_decoder, options, providers)
        self._sessions: dict[type[StepPayload], onnxruntime.InferenceSession] = {
            EncodeJob: self.encoder,
            FlowJob: self.flow,
            DecodeJob: self.decoder,
        }
        self._wide_sessions = self._faster_wide_sessions(
            wide_threads,
            providers,
            {EncodeJob: self.graphs.encoder.model, FlowJob: self.graphs.flow.model, DecodeJob: decoder_model},
        )
        self.frames_per_char: float | None = None
        """Frames of speech per character of text, from the warm-up sentence (for the encoder's share of cost)."""

    def _least_contexts(
        self, decoder: onnxruntime.InferenceSession, chunk_frames: int, threads: int
    ) -> tuple[int, int]:
        """Context frames of flow windows and decoder chunks: the least at which a sentence made in chunks of
        ``chunk_frames`` (the plan's smallest) sounds as its whole run does (``context.py``), at most the reach of
        the stage's convolutions (``graph.context_frames``). The flow's chunks are judged by the audio of the latent
        they make. Chunks run on ``threads`` at once (nothing else runs while a voice loads)."""
        flow_bound = graph.context_frames(self.graphs.flow)
        decoder_bound = graph.context_frames(self.graphs.decoder)
        stages = self.sentence_stages(MEASURING_TEXT, seed=0, decoder=decoder)
        frames, hop = stages.frames, self.hop
        with ThreadPoolExecutor(threads, thread_name_prefix="rtvoice-context") as pool:

            def decoded(latent: np.ndarray) -> np.ndarray:
                """The audio of a whole latent, in a piece per thread with the decoder's full reach as context (so
                the pieces join as one run does)."""

                def decode(lo: int, hi: int) -> np.ndarray:
                    (audio,) = decoder.run(None, {self.graphs.latent: latent[None, :, lo:hi]})
                    return audio.reshape(-1)

                return context.tiled(decode, frames, hop, -(-frames // threads), decoder_bound, pool.map)

            decoder_context = context.least_context(
                lambda frames_around: context.tiled(stages.decode, frames, hop, chunk_frames, frames_around, pool.map),
                stages.audio,
                decoder_bound,
            )
            flow_context = context.least_context(
                lambda frames_around: decoded(
                    context.tiled(stages.flow, frames, 1, chunk_frames, frames_around, pool.map)
                ),
                decoded(stages.latent),
                flow_bound,
            )
        log.info(
            "voice %s: context frames: flow %d (the graph's reach: %d), decoder %d (%d)",
            self.info.id,
            flow_context,
            flow_bound,
            decoder_context,
            decoder_bound,
        )
        return flow_context, decoder_context

    def sentence_stages(
        self, text: str, seed: int, decoder: onnxruntime.InferenceSession | None = None
    ) -> SentenceStages:
        """``text`` encoded as one segment, its whole flow and decoder runs, and runs of each on any span of its
        frames (``decoder``: a session other than the voice's own)."""
        (encoded,) = self._encode(
            [
                EncodeJob(
                    text,
                    np.random.default_rng(seed),
                    self.config.length_scale,
                    self.config.noise_scale,
                    self.config.noise_w_scale,
                )
            ]
        )
        inputs = {name: value for name, value in encoded.frame_inputs.items() if name in self.graphs.flow.inputs}
        decoder = decoder or self.decoder

        def flow(lo: int, hi: int) -> np.ndarray:
            feeds = {name: (value[None, :, lo:hi] if value.ndim == 2 else value) for name, value in inputs.items()}
            (latent,) = self.flow.run(None, feeds)
            return latent[0]

        latent = flow(0, encoded.frames)

        def decode(lo: int, hi: int) -> np.ndarray:
            (audio,) = decoder.run(None, {self.graphs.latent: latent[None, :, lo:hi]})
            return audio.reshape(-1)

        return SentenceStages(encoded.frames, flow, latent, decode, decode(0, encoded.frames))

    def _fastest_decoder(
        self, exported: onnxruntime.InferenceSession, options: onnxruntime.SessionOptions, providers: list[str]
    ) -> tuple[onnxruntime.InferenceSession, bytes]:
        """The decoder as exported, or with its convolutions run as 2-D ones (``layout.py``) when that gives the same
        audio and is faster here, timed on a chunk of the largest size the plan makes; with its model."""
        rewritten = layout.two_dimensional(self.graphs.decoder)
        channels = layout.input_channels(self.graphs.decoder)
        if rewritten is None or channels is None:
            return exported, self.graphs.decoder.model
        latent = np.random.default_rng(0).standard_normal(
            (1, channels, self.planner.chunk_size(self.geometry.max_chunk)), dtype=np.float32
        )
        feeds = {self.graphs.latent: latent}
        try:
            candidate = onnxruntime.InferenceSession(rewritten.model, options, providers=providers)
            comparison = layout.compare(exported, candidate, feeds, repeats=3)
        except Exception as error:  # onnxruntime refused the rewrite: keep the export
            log.warning("voice %s: decoder as exported (2-D form failed: %s)", self.info.id, error)
            return exported, self.graphs.decoder.model
        if not comparison.difference <= 1e-4:  # written so that a NaN difference fails too
            log.warning("voice %s: decoder as exported (2-D form differs)", self.info.id)
            return exported, self.graphs.decoder.model
        faster = comparison.two_d_s < comparison.exported_s
        log.info(
            "voice %s: decoder %s (a %d-frame chunk: %.1f ms in 2-D, %.1f ms as exported)",
            self.info.id,
            "2-D convolutions" if faster else "as exported",
            latent.shape[-1],
            comparison.two_d_s * 1e3,
            comparison.exported_s * 1e3,
        )
        return (candidate, rewritten.model) if faster else (exported, self.graphs.decoder.model)

    def _faster_wide_sessions(
        self, threads: int, providers: list[str], models: dict[type[StepPayload], bytes], repeats: int = 3
    ) -> dict[type[StepPayload], onnxruntime.InferenceSession]:
        """Sessions on ``threads`` cores for the stages whose calls before a stream's first audio they make sooner
        than one core does, with the same results to the bit, timed here on the warm-up text's first calls (the
        scheduler lends every core to a lone stream's first calls: ``run_wide``)."""
        if threads <= 1:
            return {}
        options = _session_options(threads)
        session = self.open_session(SynthesisOptions(seed=0))
        session.add_segment(MEASURING_TEXT)
        first_audio = StepBudget(call_s=0.0, due_s=None, cost=lambda kind, size: math.inf)
        faster: dict[type[StepPayload], onnxruntime.InferenceSession] = {}
        audio = None
        while audio is None and (step := session.plan_step(first_audio)) is not None:
            stage = type(step.payload)
            narrow, wide = self._sessions[stage], onnxruntime.InferenceSession(models[stage], options, providers)
            run = self._calls()[stage]
            result = run([_again(step.payload)], narrow)[0]
            narrow_s = wide_s = math.inf
            for _ in range(repeats):  # alternating, so that a burst of other work slows both
                narrow_s = min(narrow_s, _time_call(run, step.payload, narrow))
                wide_s = min(wide_s, _time_call(run, step.payload, wide))
            same = _same(result, run([_again(step.payload)], wide)[0])
            log.info(
                "voice %s: a first %s call on %d cores: %.1f ms, on one: %.1f ms%s",
                self.info.id,
                step.kind,
                threads,
                wide_s * 1e3,
                narrow_s * 1e3,
                "" if same else " (results differ: not used)",
            )
            if same and wide_s < narrow_s:
                faster[stage] = wide
            audio = session.complete(step, result)
        return faster

    @property
    def cost_key(self) -> str:
        return self.info.id  # every Piper voice has weights of its own

    def largest_step_audio_s(self) -> float | None:
        return self.geometry.max_chunk_s

    def start_cost(self, cost: CostEstimate) -> StartCost | None:
        return self.planner.start_cost(cost)

    def compute_per_audio_s(self, cost: CostEstimate) -> float | None:
        per_frame = self.planner.compute_per_frame(cost)
        if per_frame <= 0:
            return None  # nothing measured yet
        if self.frames_per_char:
            per_frame += cost(EncodeJob.kind, TYPICAL_SEGMENT_CHARS) / (TYPICAL_SEGMENT_CHARS * self.frames_per_char)
        return per_frame * self.info.sample_rate / self.hop

    # -- sessions -----------------------------------------------------------------------------

    def open_session(self, options: SynthesisOptions) -> PiperSession:
        self.validate(options)
        return PiperSession(self, options)

    # Measured on the CPU (bench/batch_calls.py), a batched call is not cheaper than its steps one by one where
    # it matters: encoder passes save ~10% on one text repeated, but requests' texts differ in length and a batch
    # pads each to the longest, so texts of one size bucket take 2-9% longer batched; flow windows save 3-7% and
    # decoder chunks take 5-20% longer. A batched call also holds back every stream in it until the slowest step
    # is done (first audio above all: at 80% of capacity, bench/load.py's TTFA p95 fell from 571-636 ms to
    # 258-488 ms with encoder passes one at a time), and a batched multi-second flow window holds its runner slot
    # long enough to make other listeners stall. So each step runs alone; the voice still runs batches when given.
    BATCH_LIMITS = {EncodeJob.kind: 1, FlowJob.kind: 1, DecodeJob.kind: 1}

    def max_batch(self, kind: str) -> int:
        return self.BATCH_LIMITS.get(kind, 1)

    def validate(self, options: SynthesisOptions) -> None:
        if not MIN_SPEED <= options.speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}")

    def phoneme_ids(self, text: str) -> list[int]:
        """One id sequence for the whole segment, even where the phonemiser sees several sentences."""
        return self._phoneme_ids(text)[0]

    def _phoneme_ids(self, text: str) -> tuple[list[int], alignment.PhonemeIds | None]:
        """The segment's ids, and which phoneme each id speaks (None when piper-tts maps them its own way)."""
        sentences = self.phonemizer.phonemize(text)
        ids: list[int] = []
        for sentence in sentences:
            if sentence:
                ids.extend(self.phonemizer.phonemes_to_ids(sentence))
        traced = alignment.phoneme_ids(sentences, self.config.phoneme_id_map)
        return ids, (traced if traced.ids == ids else None)

    def _token_timings(
        self, text: str, traced: alignment.PhonemeIds, durations: np.ndarray
    ) -> tuple[SpokenTiming, ...]:
        def phonemize(token: str) -> list[str]:
            return [phoneme for sentence in self.phonemizer.phonemize(token) for phoneme in sentence]

        return alignment.token_timings(
            text, spoken_tokens(text), traced, durations, self.hop / self.info.sample_rate, phonemize
        )

    # -- batched model calls --------------------------------------------------------------------

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        return self._run(payloads, self._sessions)

    def run_wide(self, payloads: Sequence[StepPayload]) -> list[Any]:
        return self._run(payloads, {**self._sessions, **self._wide_sessions})

    def wide_kinds(self) -> frozenset[str]:
        return frozenset(stage.kind for stage in self._wide_sessions)

    def _calls(self) -> dict[type[StepPayload], Callable[[Any, onnxruntime.InferenceSession], list[Any]]]:
        return {EncodeJob: self._encode, FlowJob: self._flow, DecodeJob: self._decode}

    def _run(
        self, payloads: Sequence[StepPayload], sessions: dict[type[StepPayload], onnxruntime.InferenceSession]
    ) -> list[Any]:
        stage = type(payloads[0])
        call = self._calls().get(stage)
        if call is None:
            raise ValueError(f"a Piper voice cannot run {stage.__name__}")
        return call(payloads, sessions[stage])

    def _encode(
        self, jobs: Sequence[EncodeJob], encoder: onnxruntime.InferenceSession | None = None
    ) -> list[EncodedSegment]:
        phonemised = [self._phoneme_ids(job.text) for job in jobs]
        id_lists = [ids for ids, _ in phonemised]
        results: list[EncodedSegment | None] = [None] * len(jobs)
        live = [i for i, ids in enumerate(id_lists) if ids]
        for i in set(range(len(jobs))) - set(live):
            results[i] = EncodedSegment(frames=0, frame_inputs={})
        if live:
            longest = max(len(id_lists[i]) for i in live)
            ids = np.zeros((len(live), longest), dtype=np.int64)
            lengths = np.zeros(len(live), dtype=np.int64)
            noises = [np.zeros((len(live), c, longest), dtype=np.float32) for c in self.duration_noise_channels]
            for row, i in enumerate(live):
                job, n = jobs[i], len(id_lists[i])
                ids[row, :n] = id_lists[i]
                lengths[row] = n
                for noise, channels in zip(noises, self.duration_noise_channels, strict=True):
                    noise[row, :, :n] = job.rng.standard_normal((channels, n), dtype=np.float32) * job.noise_w
            # Noise is drawn (and scaled) per stream above, so the graph's own scales stay at one.
            feeds: dict[str, np.ndarray] = {
                "input": ids,
                "input_lengths": lengths,
                "scales": np.array([1.0, jobs[live[0]].length_scale, 1.0], dtype=np.float32),
                **dict(zip(self.graphs.duration_noise, noises, strict=True)),
            }
            if "sid" in self.graphs.encoder.inputs:
                feeds["sid"] = np.full(len(live), self.config.default_speaker_id, dtype=np.int64)
            outputs = dict(zip(self.graphs.encoder.outputs, (encoder or self.encoder).run(None, feeds), strict=True))
            durations = outputs.pop(self.graphs.durations)
            mask = outputs[self.graphs.frame_mask]
            padded_frames = mask.shape[-1]
            for row, i in enumerate(live):
                frames = int(mask[row].sum())
                frame_inputs = {
                    name: (value[row, ..., :frames] if value.ndim == 3 and value.shape[-1] == padded_frames else value)
                    for name, value in outputs.items()
                }
                mean = frame_inputs[self.graphs.prior_mean]
                frame_inputs[self.graphs.prior_noise] = (
                    jobs[i].rng.standard_normal(mean.shape, dtype=np.float32) * jobs[i].noise_scale
                )
                traced = phonemised[i][1]
                tokens = None if traced is None else self._token_timings(jobs[i].text, traced, durations[row, 0])
                results[i] = EncodedSegment(frames=frames, frame_inputs=frame_inputs, tokens=tokens)
        return results  # type: ignore[return-value]

    def _flow(self, jobs: Sequence[FlowJob], flow: onnxruntime.InferenceSession) -> list[np.ndarray]:
        longest = max(job.inputs[self.graphs.frame_mask].shape[-1] for job in jobs)
        feeds: dict[str, np.ndarray] = {}
        for name in self.graphs.flow.inputs:
            values = [job.inputs[name] for job in jobs]
            if values[0].ndim == 2:  # frame-local [C, T]: zero-pad; the mask keeps padding out
                batch = np.zeros((len(jobs), values[0].shape[0], longest), dtype=values[0].dtype)
                for row, value in enumerate(values):
                    batch[row, :, : value.shape[-1]] = value
                feeds[name] = batch
            else:
                feeds[name] = values[0]
        (latent,) = flow.run(None, feeds)
        return [latent[row, :, job.keep_from : job.keep_from + job.keep_frames] for row, job in enumerate(jobs)]

    def _decode(self, jobs: Sequence[DecodeJob], decoder: onnxruntime.InferenceSession) -> list[np.ndarray]:
        (audio,) = decoder.run(None, {self.graphs.latent: np.stack([job.latent for job in jobs])})
        return list(audio.reshape(len(jobs), -1))

    def warmup(self) -> None:
        text = MEASURING_TEXT
        session = self.open_session(SynthesisOptions(seed=0))
        session.add_segment(text)
        while (step := session.next_step()) is not None:
            (result,) = self.run([step.payload])
            if isinstance(step.payload, EncodeJob):
                self.frames_per_char = result.frames / len(text)
            session.complete(step, result)


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
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _time_call(run: Callable[..., Any], payload: StepPayload, session: onnxruntime.InferenceSession) -> float:
    """Seconds of one ``run`` of ``payload`` on ``session`` (run again with the same result)."""
    return _seconds(lambda: run([_again(payload)], session))


class PiperSession(VoiceSession):
    def __init__(self, voice: PiperVoice, options: SynthesisOptions) -> None:
        self.voice = voice
        self.rng = np.random.default_rng(options.seed)
        self.length_scale = voice.config.length_scale / options.speed
        self.pending: deque[_Segment] = deque()
        self.current: _Segment | None = None
        self.owes_audio = False
        """True from a segment added while nothing was being synthesised until its first audio."""
        self.timings: list[SegmentTimings] = []
        """Token timings of encoded segments, until the stream takes them."""

    @property
    def idle(self) -> bool:
        return self.current is None and not self.pending

    def take_timings(self) -> list[SegmentTimings]:
        timings, self.timings = self.timings, []
        return timings

    def add_segment(self, text: str) -> None:
        if self.idle:
            self.owes_audio = True
        self.pending.append(_Segment(text=text))

    def next_step(self) -> PiperStep | None:
        """The plan without a scheduler's budget: a small first chunk, then windows and chunks at their caps."""
        unbounded = StepBudget(
            call_s=math.inf, due_s=None if self.owes_audio else math.inf, cost=lambda kind, size: 0.0
        )
        return self.plan_step(unbounded)

    def plan_step(self, budget: StepBudget) -> PiperStep | None:
        # Pure: it describes the next step without changing the session, so the
        # scheduler may ask every stream and schedule only some of them.
        v = self.voice
        if self.current is None:
            if not self.pending:
                return None
            job = EncodeJob(
                text=self.pending[0].text,
                rng=self.rng,
                length_scale=self.length_scale,
                noise_scale=v.config.noise_scale,
                noise_w=v.config.noise_w_scale,
            )
            # Batch keys carry a size bucket: padding a short step to a long one's length would slow the short one.
            size_bucket = len(job.text) // 64
            return Step(
                (job.kind, v.info.id, self.length_scale, size_bucket),
                job,
                self,
                size=len(job.text),
                until_audio=(
                    (FlowJob.kind, v.planner.first_window_size()),
                    (DecodeJob.kind, v.planner.first_chunk_size()),
                ),
            )
        segment = self.current
        action = v.planner.next(segment.progress, budget)
        if isinstance(action, DecodeChunk):
            latent = segment.latent[:, action.lo : action.hi]  # type: ignore[index]
            return Step(
                (DecodeJob.kind, v.info.id, action.size),
                DecodeJob(latent, action.lo, action.end),
                self,
                size=action.size,
            )
        inputs = {
            name: (value[:, action.lo : action.hi] if value.ndim == 2 else value)
            for name, value in segment.frame_inputs.items()
        }
        job = FlowJob(inputs=inputs, keep_from=action.start - action.lo, keep_frames=action.end - action.start)
        then = v.planner.chunk(segment.progress, v.planner.chunk_end(segment.progress, v.geometry.first_chunk))
        return Step(
            (job.kind, v.info.id, action.size // 32),
            job,
            self,
            size=action.size,
            until_audio=((DecodeJob.kind, then.size),),
        )

    def remaining_audio_s(self) -> float | None:
        v = self.voice
        frame_s = v.hop / v.info.sample_rate
        frames = 0.0
        if self.current is not None:
            frames += self.current.frames - self.current.decoded
        if self.pending:
            if not v.frames_per_char:
                return None  # not warmed up: no measure of how long its text speaks
            speed = self.length_scale / v.config.length_scale
            frames += sum(len(segment.text) for segment in self.pending) * v.frames_per_char * speed
        return frames * frame_s

    def complete(self, step: PiperStep, result: Any) -> np.ndarray | None:
        payload = step.payload
        if isinstance(payload, EncodeJob):
            segment = self.pending.popleft()
            encoded: EncodedSegment = result
            if encoded.tokens is not None:
                self.timings.append(SegmentTimings(self.segments_done, encoded.tokens))
            if encoded.frames == 0:
                self.segments_done += 1
                return None
            self.current = segment
            segment.frames = encoded.frames
            segment.frame_inputs = {k: v for k, v in encoded.frame_inputs.items() if k in self.voice.graphs.flow.inputs}
            channels = segment.frame_inputs[self.voice.graphs.prior_mean].shape[0]
            segment.latent = np.empty((channels, encoded.frames), dtype=np.float32)
            return None
        segment = self.current
        assert segment is not None
        if isinstance(payload, FlowJob):
            segment.latent[:, segment.flowed : segment.flowed + payload.keep_frames] = result  # type: ignore[index]
            segment.flowed += payload.keep_frames
            return None
        hop = self.voice.hop
        start, end = payload.start, payload.end
        audio = result[(segment.decoded - start) * hop :]
        body = audio[: (end - segment.decoded) * hop].copy()
        if segment.tail is not None and len(segment.tail):
            overlap = min(len(segment.tail), len(body))
            body[:overlap] = hamming_crossfade(segment.tail[:overlap], body[:overlap])
        tail_from = (end - segment.decoded) * hop
        segment.tail = audio[tail_from : tail_from + self.voice.geometry.overlap * hop]
        segment.decoded = end
        self.owes_audio = False
        if end >= segment.frames:
            self.current = None
            self.segments_done += 1
        return body
