"""Runs CosyVoice2's batched steps on one loaded model: what every voice of that model holds.

It owns what the steps need (the weights, the device, the front end that turns text into ids, the model's
limits) and runs ``lm`` and ``token2wav`` batches. The voices plan steps against it; the service
(``service.py``) builds it and the voices, and nothing here knows either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rtvoice.engine.models.base import StepPayload

from .frontend import Frontend, ids_tensor, load_tokenizer
from .info import MODEL_NAME
from .loader import QWEN_DIR
from .model import CosyVoice2Model
from .steps import MAX_TOKEN_TEXT_RATIO, MIN_TOKEN_TEXT_RATIO, LMResult, NextTokenJob, PrefillJob, Token2WavJob
from .token2wav import FlowPrompt

GPU_TOKEN2WAV_BATCH = 8
"""Token-to-wave chunks per call on a GPU unless set (``RTVOICE_COSYVOICE_TOKEN2WAV_BATCH``); 1 on a CPU."""


def default_token2wav_batch(device: torch.device) -> int:
    # On a CPU a padded flow batch costs about what its rows cost one by one (bench/cosyvoice2_scale.py),
    # and one long call delays every other stream's next step; on a GPU it is nearly free.
    return GPU_TOKEN2WAV_BATCH if device.type == "cuda" else 1


class CosyVoice2Runner:
    def __init__(
        self,
        model: CosyVoice2Model,
        model_dir: Path,
        device: torch.device,
        threads: int = 1,
        token2wav_batch: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.model = model
        self.device = device
        self.threads = max(1, threads)
        self.token2wav_batch = max(1, token2wav_batch or default_token2wav_batch(device))
        """Most token-to-wave chunks one call takes (the voices' ``max_batch('token2wav')``)."""
        self.overlaps_token2wav = device.type == "cuda"
        """Token-to-wave chunks run beside the LM's steps (the sessions' concurrent lane): on a GPU, where each
        runner thread has its own CUDA stream; on a CPU the two would share the cores."""
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        """LM decode steps at bucketed shapes, captured as CUDA graphs at warm-up (``RTVOICE_COSYVOICE_CUDA_GRAPHS``;
        the CPU runs exact shapes eagerly)."""
        if self.cuda_graphs:
            model.llm.use_decode_graphs(capture=True)
        self.model_key = f"{MODEL_NAME}:{model_dir.resolve()}"
        """Batch keys carry this, so steps of every voice of this model may share a call."""
        vocab = model.llm.backbone.config.vocab_size
        self.frontend = Frontend(
            load_tokenizer(model_dir / QWEN_DIR, vocab),
            model.mel,
            model.sample_rate,
            model.config.token_mel_ratio,
            model.speech_tokenizer,
            model.campplus,
        )
        noise_frames = model.flow.decoder.rand_noise.shape[2]
        self.max_flow_tokens = noise_frames // model.config.token_mel_ratio - 1
        """Prompt plus speech tokens one flow call can take (its fixed noise is that long)."""
        self.mel_bins = model.config.flow.output_size
        self._warm = False
        self._local = threading.local()
        self._warm_lock = threading.Lock()

    def use_threads(self) -> None:
        """torch's intra-op thread count for the calling thread (OpenMP keeps it per OS thread, and runner
        threads may predate the load)."""
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    # -- batched steps ----------------------------------------------------------------------------

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        """One batch: LM jobs (prefills or next tokens) or token-to-wave chunks."""
        calls: dict[type[StepPayload], Callable[[Any], list[Any]]] = {
            PrefillJob: self._lm,
            NextTokenJob: self._lm,
            Token2WavJob: self._token2wav,
        }
        call = calls.get(type(payloads[0]))
        if call is None:
            raise ValueError(f"a CosyVoice2 voice cannot run {type(payloads[0]).__name__}")
        self.use_threads()
        if self.device.type != "cuda":
            return call(payloads)
        stream = self._cuda_stream()
        with torch.cuda.stream(stream):
            results = call(payloads)
        stream.synchronize()  # its results go to the event loop, and the next call may run on another thread
        return results

    def _cuda_stream(self) -> torch.cuda.Stream:
        """The calling runner thread's own CUDA stream, so an LM step and a token-to-wave chunk run at once."""
        stream: torch.cuda.Stream | None = getattr(self._local, "cuda_stream", None)
        if stream is None:
            stream = self._local.cuda_stream = torch.cuda.Stream(device=self.device)
        return stream

    def _lm(self, jobs: Sequence[PrefillJob | NextTokenJob]) -> list[LMResult]:
        llm = self.model.llm
        streams = []
        for job in jobs:
            if isinstance(job, PrefillJob):
                text_ids = ids_tensor(job.text_ids, self.device)
                stream = llm.start(
                    text_ids,
                    job.prompt.text_ids,
                    job.prompt.speech_tokens,
                    generator=job.generator,
                    min_token_text_ratio=MIN_TOKEN_TEXT_RATIO,
                    max_token_text_ratio=MAX_TOKEN_TEXT_RATIO,
                )
                stream.max_len = min(stream.max_len, job.max_tokens)
                stream.min_len = min(stream.min_len, stream.max_len)
                stream.finished = stream.max_len <= 0
                streams.append(stream)
            else:
                streams.append(job.stream)
        live = [s for s in streams if not s.finished]
        tokens: dict[int, int | None] = {}
        if live and "choose" in vars(llm):
            # A choose set on the instance (bench/cosyvoice2_scale.py forces lengths) keeps the per-stream path.
            for stream, logp in zip(live, llm.forward_step(live), strict=True):
                tokens[id(stream)] = llm.choose(stream, logp)
        elif live:
            for stream, token in zip(live, llm.step(live), strict=True):
                tokens[id(stream)] = token
        return [LMResult(stream, tokens.get(id(stream))) for stream in streams]

    def _token2wav(self, jobs: Sequence[Token2WavJob]) -> list[np.ndarray]:
        chunks = self.model.token2wav.step_many([job.stream for job in jobs], [job.plan for job in jobs])
        return [speech.reshape(-1).float().cpu().numpy() for speech in chunks]

    def max_lm_positions(self) -> int:
        """Positions a stream's KV slot is reserved for at warm-up: its speech tokens (the prompt's and the LM's share
        the flow's fixed noise) and the two special ones; text ids beyond the power of two above grow the pool."""
        return self.max_flow_tokens + 2

    # -- warmup -----------------------------------------------------------------------------------

    def warmup(self, prompt: FlowPrompt | None = None) -> None:
        """Every code path once (prefill, decode steps, a streaming chunk, a final chunk), once per model;
        ``prompt``: a voice's flow prompt (an empty one when None)."""
        with self._warm_lock:
            if self._warm:
                return
            self.use_threads()
            llm, t2w = self.model.llm, self.model.token2wav
            generator = torch.Generator(device=self.device).manual_seed(0)
            empty = torch.zeros(1, 0, dtype=torch.int32, device=self.device)
            text = ids_tensor(self.frontend.text_ids("Warming up."), self.device)
            stream = llm.start(text, empty, empty, generator=generator)
            for _ in range(3):
                logp = llm.forward_step([stream])[0]
                llm.choose(stream, logp)
            if self.cuda_graphs and llm.decode_graphs is not None:
                llm.decode_graphs.capture_all(self.max_lm_positions())  # before any decode call would capture one
            if not stream.finished:
                llm.step([stream])  # the batched sampler (on CUDA: a graph's replay)
            llm.release(stream)
            if prompt is None:
                prompt = FlowPrompt(
                    empty,
                    torch.zeros(1, 0, self.mel_bins, device=self.device),
                    torch.zeros(1, self.model.config.flow.spk_embed_dim, device=self.device),
                )
            chunks = t2w.stream(prompt, generator)
            chunks.add_tokens([1] * (t2w.chunk_size * 2 + t2w.pre_lookahead))
            chunks.step()
            chunks.end()
            while chunks.ready():
                chunks.step()
            self._warm = True
