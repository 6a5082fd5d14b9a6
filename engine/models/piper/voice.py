"""Piper voices: a voice's weights loaded and split into three stages, and batches of steps run through them.

A segment runs through the stages (see ``graph.py``): one encoder pass gives its frame-level prior; the flow turns
windows of it into latent frames; the decoder turns chunks of latent into audio. Splitting them lets a stream's
session (``session.py``) hear a segment's first chunk long before the segment is done; what the voice measures of
itself at load to do that well is ``measure.py``'s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from piper.config import PhonemeType, PiperConfig
from piper.voice import PiperVoice as PiperPhonemizer

from rtvoice.engine.models.base import (
    MAX_SPEED,
    MIN_SPEED,
    CostEstimate,
    SpokenTiming,
    StartCost,
    StepPayload,
    SynthesisOptions,
    Voice,
    VoiceInfo,
)
from rtvoice.engine.models.piper import alignment, measure, pace, prepare
from rtvoice.engine.models.piper import int8 as int8_parts
from rtvoice.engine.models.piper.int8 import Int8Mode
from rtvoice.engine.models.piper.measure import MEASURING_TEXT, SentenceStages
from rtvoice.engine.models.piper.plan import ChunkPlan, Geometry, Planner
from rtvoice.engine.models.piper.session import PiperSession
from rtvoice.engine.models.piper.steps import DecodeJob, EncodedSegment, EncodeJob, FlowJob
from rtvoice.engine.text import spoken_tokens

log = logging.getLogger(__name__)

TYPICAL_SEGMENT_CHARS = 100
"""A segment of this many characters stands for all in the steady-cost estimate (encoder cost per character
falls slightly with length)."""


def _session_options(intra_op_threads: int) -> onnxruntime.SessionOptions:
    """onnxruntime's options for a stage's session on ``intra_op_threads`` cores, one call at a time."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    # Spinning worker threads would burn the cores that other runners need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class PiperVoice(Voice):
    """One Piper voice: its phonemiser, its three stages' sessions and what it measured of them at load."""

    def __init__(
        self,
        model_path: Path,
        voice_id: str | None = None,
        plan: ChunkPlan | None = None,
        intra_op_threads: int = 1,
        wide_threads: int = 1,
        measured_dir: Path | None = None,
        int8: Int8Mode = "off",
        int8_dir: Path | None = None,
        stages_dir: Path | None = None,
    ) -> None:
        """``wide_threads``: the cores a call may use when the runner lends it every slot (``run_wide``);
        ``measured_dir``: where the context frames measured for these weights are kept (None: measured each time);
        ``int8``: which parts run in int8 (``int8.py``), kept in ``int8_dir`` (None: built each time);
        ``stages_dir``: where the split stages are kept (``prepare.py``; None: split each time)."""
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
            # Piper's phonemiser reads [[ phonemes ]] (IPA) in espeak-ng voices only.
            reads_phonemes=self.config.phoneme_type == PhonemeType.ESPEAK,
        )
        self.hop = self.config.hop_length
        # piper-tts's own phonemiser (espeak-ng and friends); its ONNX session is ours, not its.
        self.phonemizer = PiperPhonemizer(session=None, config=self.config)

        model_bytes = model_path.read_bytes()
        weights_sha256 = hashlib.sha256(model_bytes).hexdigest()
        prepared = prepare.prepared(model_bytes, weights_sha256, stages_dir)
        del model_bytes
        self.graphs = prepared.graphs
        self.duration_noise_channels = prepared.duration_noise_channels
        options = _session_options(intra_op_threads)
        providers = ["CPUExecutionProvider"]
        self.encoder = onnxruntime.InferenceSession(self.graphs.encoder.model, options, providers=providers)
        self.flow = onnxruntime.InferenceSession(self.graphs.flow.model, options, providers=providers)
        # Made only where it is measured or chosen: a start that reads back the 2-D choice never needs it (37 ms).
        exported_decoder = functools.cache(
            lambda: onnxruntime.InferenceSession(self.graphs.decoder.model, options, providers=providers)
        )
        frame_ms = 1000 * self.hop / self.info.sample_rate
        chunk_frames = plan.first_chunk_frames(frame_ms)
        key = measure.contexts_key(weights_sha256, config_bytes, chunk_frames)
        self.options, self.providers = options, providers
        flow_context, decoder_context = measure.remembered(
            measured_dir,
            key,
            lambda: measure.least_contexts(
                self.info.id,
                self.graphs,
                self.hop,
                self.sentence_stages(MEASURING_TEXT, seed=0, decoder=exported_decoder()),
                exported_decoder(),
                chunk_frames,
                max(1, wide_threads),
            ),
        )
        self.flow_context, self.decoder_context = int(flow_context), int(decoder_context)
        kept = functools.partial(measure.remembered, measured_dir)

        self.geometry = Geometry.of(plan, frame_ms, self.flow_context, self.decoder_context)
        self.planner = Planner(self.geometry)
        self.decoder, decoder_model = measure.fastest_decoder(
            self.info.id,
            prepared,
            exported_decoder,
            self.planner.chunk_size(self.geometry.max_chunk),
            options,
            providers,
            kept=kept,
            weights_sha256=weights_sha256,
        )
        # The int8 decoder is built on the 2-D form wherever there is one (faster in int8 here: docs/decisions.md),
        # not on the form timed faster at this load, so a kept build does not depend on a timing.
        two_d = prepared.two_d_decoder
        self.int8 = int8_parts.parts(
            self.info.id,
            int8,
            int8_dir,
            int8_parts.build_key(weights_sha256, "2-D" if two_d is not None else "as exported"),
            self.graphs.encoder,
            self.graphs.prior_mean,
            self.graphs.durations,
            (two_d or self.graphs.decoder).model,
            self._int8_synthesis(),
        )
        if self.int8.encoder is not None:
            self.encoder = onnxruntime.InferenceSession(self.int8.encoder, options, providers=providers)
        if self.int8.decoder is not None:
            decoder_model = self.int8.decoder
            self.decoder = onnxruntime.InferenceSession(decoder_model, options, providers=providers)
        self._sessions: dict[type[StepPayload], onnxruntime.InferenceSession] = {
            EncodeJob: self.encoder,
            FlowJob: self.flow,
            DecodeJob: self.decoder,
        }
        self._wide_sessions = measure.faster_wide_sessions(
            self.info.id,
            self.open_session,
            self._calls(),
            self._sessions,
            {
                EncodeJob: self.int8.encoder or self.graphs.encoder.model,
                FlowJob: self.graphs.flow.model,
                DecodeJob: decoder_model,
            },
            _session_options(wide_threads),
            providers,
            kept=kept,
            weights_sha256=weights_sha256,
        )
        self.frames_per_char: float | None = None
        """Frames of speech per character of text, from the warm-up sentence (for the encoder's share of cost)."""

    def sentence_stages(
        self,
        text: str,
        seed: int,
        decoder: onnxruntime.InferenceSession | None = None,
        encoder: onnxruntime.InferenceSession | None = None,
    ) -> SentenceStages:
        """``text`` encoded as one segment, its whole flow and decoder runs, and runs of each on any span of its
        frames (``decoder``, ``encoder``: sessions other than the voice's own)."""
        (encoded,) = self._encode([self._sentence_job(text, seed)], encoder)
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

    def _sentence_job(self, text: str, seed: int) -> EncodeJob:
        return EncodeJob(
            text,
            np.random.default_rng(seed),
            self.config.length_scale,
            self.config.noise_scale,
            self.config.noise_w_scale,
            timings=False,  # measurements and int8 builds read no words
        )

    def _int8_synthesis(self) -> int8_parts.Synthesis:
        """The voice's fp32 stages, with other encoder and decoder models, for building and judging int8 parts."""
        sessions: dict[bytes, onnxruntime.InferenceSession] = {}

        def session(model: bytes) -> onnxruntime.InferenceSession:
            if model not in sessions:
                sessions[model] = onnxruntime.InferenceSession(model, self.options, providers=self.providers)
            return sessions[model]

        def encoder_feeds(text: str, seed: int) -> dict[str, np.ndarray]:
            job = self._sentence_job(text, seed)
            return self._encoder_feeds([job], [self.phoneme_ids(text)], [0])

        def latent(text: str, seed: int, encoder: bytes | None) -> np.ndarray:
            return self.sentence_stages(text, seed, encoder=None if encoder is None else session(encoder)).latent

        def decode(latent: np.ndarray, decoder: bytes | None) -> np.ndarray:
            (audio,) = (self.decoder if decoder is None else session(decoder)).run(
                None, {self.graphs.latent: latent[None]}
            )
            return np.asarray(audio).reshape(-1)

        return int8_parts.Synthesis(encoder_feeds, latent, decode, self.graphs.latent, self.info.sample_rate)

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

    # Each step runs alone: on the CPU a batched call is not cheaper where it matters, and it holds every stream in
    # it back until its slowest step is done (figures: docs/decisions.md). The voice still runs batches when given.
    BATCH_LIMITS = {EncodeJob.kind: 1, FlowJob.kind: 1, DecodeJob.kind: 1}

    def max_batch(self, kind: str) -> int:
        return self.BATCH_LIMITS.get(kind, 1)

    def validate(self, options: SynthesisOptions) -> None:
        if not MIN_SPEED <= options.speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}")

    def phoneme_ids(self, text: str) -> list[int]:
        """One id sequence for the whole segment, even where the phonemiser sees several sentences."""
        return self._phoneme_ids(text, trace=False)[0]

    def _phoneme_ids(self, text: str, trace: bool) -> tuple[list[int], alignment.PhonemeIds | None]:
        """The segment's ids, and with ``trace`` which phoneme each id speaks (None without, or when piper-tts maps
        them its own way)."""
        sentences = self.phonemizer.phonemize(text)
        ids: list[int] = []
        for sentence in sentences:
            if sentence:
                ids.extend(self.phonemizer.phonemes_to_ids(sentence))
        if not trace:
            return ids, None
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

    def _calls(self) -> dict[type[StepPayload], measure.StageCall]:
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
        phonemised = [self._phoneme_ids(job.text, job.timings) for job in jobs]
        id_lists = [ids for ids, _ in phonemised]
        results: list[EncodedSegment | None] = [None] * len(jobs)
        live = [i for i, ids in enumerate(id_lists) if ids]
        for i in set(range(len(jobs))) - set(live):
            results[i] = EncodedSegment(frames=0, frame_inputs={})
        if live:
            feeds = self._encoder_feeds(jobs, id_lists, live)
            outputs = dict(zip(self.graphs.encoder.outputs, (encoder or self.encoder).run(None, feeds), strict=True))
            durations = outputs.pop(self.graphs.durations)
            mask = outputs[self.graphs.frame_mask]
            padded_frames = mask.shape[-1]
            for row, i in enumerate(live):
                frames = int(mask[row].sum())
                picks: np.ndarray | slice = slice(0, frames)
                token_frames = durations[row, 0]
                if jobs[i].speed != 1.0:
                    paced = pace.paced_durations(token_frames, jobs[i].speed)
                    picks, token_frames, frames = pace.frame_picks(token_frames, paced), paced, int(paced.sum())
                frame_inputs = {
                    name: (value[row][..., picks] if value.ndim == 3 and value.shape[-1] == padded_frames else value)
                    for name, value in outputs.items()
                }
                mean = frame_inputs[self.graphs.prior_mean]
                frame_inputs[self.graphs.prior_noise] = (
                    jobs[i].rng.standard_normal(mean.shape, dtype=np.float32) * jobs[i].noise_scale
                )
                traced = phonemised[i][1]
                tokens = None if traced is None else self._token_timings(jobs[i].text, traced, token_frames)
                results[i] = EncodedSegment(frames=frames, frame_inputs=frame_inputs, tokens=tokens)
        return [result for result in results if result is not None]  # every job's row was filled above

    def _encoder_feeds(
        self, jobs: Sequence[EncodeJob], id_lists: Sequence[list[int]], live: Sequence[int]
    ) -> dict[str, np.ndarray]:
        """The encoder's feeds for the ``live`` jobs (those with ids), padded to the longest; draws their noise."""
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
        return feeds

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
