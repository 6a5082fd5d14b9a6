"""CosyVoice2 voices on the scheduler's interface: LM steps and token-to-wave chunks.

A segment is one LM run and one token-to-wave stream. Its first ``lm`` step is the prefill (the
prompt through the backbone, then the first token); each later ``lm`` step decodes one token. Tokens
go to the segment's :class:`~engine.models.cosyvoice2.token2wav.Token2WavStream` as they come, and
as soon as it holds a chunk's worth (its hop schedule: the first hop padded so the prompt plus the
hop fill whole flow chunks, then doubling) the session's next step is a ``token2wav`` chunk instead
of the next token; once the LM stops, the final chunk flushes the rest. The next segment starts
when this one's audio is complete.

Every voice of one loaded model (spk2info speakers, registered voices, the one-off voice of a
zero-shot request) holds the model's one ``CosyVoice2Runner`` (``runner.py``), which runs the steps:
batch keys name the model, not the voice, and every payload (``steps.py``) carries its stream's own
state and prompt, so steps of different speakers share a call. A session
holds all per-request state: the LM stream (KV cache, tokens), the token-to-wave stream (hop,
caches) and two private generators seeded from the request's seed (sampling; HiFT's source).

Modes (the LM and flow inputs, as the reference front end builds them):

=============  ===========================================  ====================================
mode           LM: prompt text ids, prompt speech tokens    flow: prompt tokens, prompt mel, x-vector
=============  ===========================================  ====================================
sft            -, -                                         -, -, speaker embedding
zero_shot      prompt text, prompt tokens                   prompt tokens, prompt mel, embedding
cross_lingual  -, -                                         prompt tokens, prompt mel, embedding
instruct2      instruction + ``<|endofprompt|>``, -          prompt tokens, prompt mel, embedding
=============  ===========================================  ====================================

A request's ``instructions`` (OpenAI's field) switch any voice to instruct2 with them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rtvoice.engine.models.base import Step, StepPayload, SynthesisOptions, Voice, VoiceInfo, VoiceSession

from . import info as model_info
from .frontend import END_OF_PROMPT, PromptFeatures, ids_tensor, normalize_segment
from .llm import LMStream
from .runner import CosyVoice2Runner
from .sampling import new_generator
from .steps import CosyVoice2Step, LMPrompt, LMResult, NextTokenJob, PrefillJob, Token2WavJob
from .token2wav import FlowPrompt, Token2WavStream

Mode = Literal["sft", "zero_shot", "cross_lingual", "instruct2"]
MODES: tuple[Mode, ...] = ("sft", "zero_shot", "cross_lingual", "instruct2")


def instruction_text(instructions: str) -> str:
    """An instruct2 prompt: the instruction ending in ``<|endofprompt|>`` (added when missing)."""
    text = instructions.strip()
    return text if text.endswith(END_OF_PROMPT) else text + END_OF_PROMPT


@dataclass
class _Segment:
    text: str
    text_ids: list[int]
    lm: LMStream | None = None
    t2w: Token2WavStream | None = None
    chunks: int = 0


# -- the voice ------------------------------------------------------------------------------------


class CosyVoice2Voice(Voice):
    """One speaker of a loaded CosyVoice2 model, in one mode."""

    def __init__(
        self,
        runner: CosyVoice2Runner,
        info: VoiceInfo,
        features: PromptFeatures,
        mode: Mode | None = None,
        instructions: str | None = None,
        source: str = "",
    ) -> None:
        self.runner = runner
        self.info = info
        self.features = features
        has_prompt_speech = features.speech_tokens.shape[1] > 0
        # By default: zero-shot with a transcribed prompt, cross-lingual without a transcript, sft without speech.
        default: Mode = "sft"
        if has_prompt_speech:
            default = "zero_shot" if features.prompt_text_ids is not None else "cross_lingual"
        self.mode: Mode = mode or default
        if self.mode not in MODES:
            raise ValueError(f"unknown CosyVoice2 mode {self.mode!r}")
        if self.mode == "instruct2" and not instructions:
            raise ValueError("instruct2 needs an instruction")
        if self.mode == "zero_shot" and (not has_prompt_speech or features.prompt_text_ids is None):
            raise ValueError("zero-shot needs prompt speech and its transcript")
        self.instructions = instructions
        self.source = source
        """Where the voice came from: 'spk2info', 'registered', or 'request' (a one-off prompt)."""
        device = runner.device
        self.flow_prompt = FlowPrompt(
            tokens=features.speech_tokens.to(device),
            feat=features.speech_feat.to(device),
            embedding=features.embedding.to(device),
        )
        self.lm_prompt = self._lm_prompt(self.mode, instructions)

    def _lm_prompt(self, mode: Mode, instructions: str | None) -> LMPrompt:
        device = self.runner.device
        empty = torch.zeros(1, 0, dtype=torch.int32, device=device)
        if mode == "zero_shot":
            assert self.features.prompt_text_ids is not None
            return LMPrompt(self.features.prompt_text_ids.to(device), self.features.speech_tokens.to(device))
        if mode == "instruct2":
            assert instructions is not None
            return LMPrompt(ids_tensor(self.runner.frontend.text_ids(instruction_text(instructions)), device), empty)
        return LMPrompt(empty, empty)  # sft, cross_lingual: the LM sees only the text to speak

    @property
    def model_key(self) -> str:
        return self.runner.model_key

    def open_session(self, options: SynthesisOptions) -> CosyVoice2Session:
        self.validate(options)
        lm_prompt = self.lm_prompt
        if options.instructions and options.instructions.strip():
            lm_prompt = self._lm_prompt("instruct2", options.instructions)
        return CosyVoice2Session(self, options, lm_prompt)

    def validate(self, options: SynthesisOptions) -> None:
        model_info.validate(options)

    # LM steps of many streams share one batched backbone pass (``Qwen2LM.forward_step``); token-to-wave
    # chunks of several streams share one padded flow call (and HiFT calls per window length) up to the
    # runner's limit: 1 on a CPU, where a batch costs as much as its rows run one by one (bench/cosyvoice2_scale.py),
    # more on a GPU.
    BATCH_LIMITS = {PrefillJob.kind: 1 << 16, Token2WavJob.kind: 1}

    def max_batch(self, kind: str) -> int:
        if kind == Token2WavJob.kind:
            return self.runner.token2wav_batch
        return self.BATCH_LIMITS.get(kind, 1)

    def run(self, payloads: Sequence[StepPayload]) -> list[Any]:
        # Any voice of the model runs any payload of the model: payloads carry their own prompts.
        return self.runner.run(payloads)

    def warmup(self) -> None:
        self.runner.warmup(self.flow_prompt)


class CosyVoice2Session(VoiceSession):
    def __init__(self, voice: CosyVoice2Voice, options: SynthesisOptions, lm_prompt: LMPrompt) -> None:
        self.voice = voice
        self.runner = voice.runner
        self.lm_prompt = lm_prompt
        device = self.runner.device
        # One generator for token sampling and one for HiFT's source: the tokens do not depend on
        # how chunks interleave with decode steps. Seeded from the request's seed when it has one.
        self.lm_generator = new_generator(options.seed, device=device)
        self.vocoder_generator = new_generator(None if options.seed is None else options.seed + 1, device=device)
        self.pending: deque[_Segment] = deque()
        self.current: _Segment | None = None
        # The flow takes prompt + speech tokens against its fixed noise, which bounds their sum.
        self.max_tokens = max(0, self.runner.max_flow_tokens - voice.flow_prompt.tokens.shape[1])

    @property
    def idle(self) -> bool:
        return self.current is None and not self.pending

    def add_segment(self, text: str, rate: float = 1.0) -> None:
        text = normalize_segment(text)
        self.pending.append(_Segment(text=text, text_ids=self.runner.frontend.text_ids(text)))

    def next_step(self) -> CosyVoice2Step | None:
        # Pure: it describes the next step without changing the session.
        key = self.voice.model_key
        segment = self.current
        if segment is None:
            if not self.pending:
                return None
            segment = self.pending[0]
            job = PrefillJob(segment.text_ids, self.lm_prompt, self.lm_generator, self.max_tokens)
            length = len(segment.text_ids) + self.lm_prompt.text_ids.shape[1] + self.lm_prompt.speech_tokens.shape[1]
            return Step((job.kind, key, "prefill", length // 64), job, self)
        assert segment.lm is not None and segment.t2w is not None
        if segment.t2w.ready() and (segment.lm.finished or not self.runner.overlaps_token2wav):
            return self._token2wav_step(segment.t2w)
        if not segment.lm.finished:
            return Step((NextTokenJob.kind, key, "decode"), NextTokenJob(segment.lm), self)
        raise AssertionError("a segment whose LM stopped is either flushing or done")

    def concurrent_step(self) -> CosyVoice2Step | None:
        # On a GPU, while the LM decodes (``next_step``), a chunk whose tokens are all there turns into audio beside
        # it, so the LM keeps stepping every stream while chunks are vocoded. The chunk's tokens are fixed with the
        # step. On a CPU the two would share the cores: the chunk goes first on the one lane instead.
        segment = self.current
        if not self.runner.overlaps_token2wav or segment is None or segment.lm is None or segment.t2w is None:
            return None
        return self._token2wav_step(segment.t2w) if segment.t2w.ready() and not segment.lm.finished else None

    def _token2wav_step(self, t2w: Token2WavStream) -> CosyVoice2Step:
        # A chunk's flow call covers the prompt and every token so far; rows of one call are padded to the
        # longest, so chunks are grouped by that length within a factor of two.
        plan = t2w.plan()
        flow_tokens = t2w.prompt.tokens.shape[1] + len(plan.tokens)
        key = self.voice.model_key
        return Step((Token2WavJob.kind, key, flow_tokens.bit_length()), Token2WavJob(t2w, plan), self)

    def complete(self, step: CosyVoice2Step, result: Any) -> np.ndarray | None:
        if isinstance(step.payload, (PrefillJob, NextTokenJob)):
            lm_result: LMResult = result
            if isinstance(step.payload, PrefillJob):
                started = self.pending.popleft()
                started.lm = lm_result.stream
                started.t2w = self.runner.model.token2wav.stream(self.voice.flow_prompt, self.vocoder_generator)
                self.current = started
            segment = self.current
            assert segment is not None and segment.t2w is not None
            if lm_result.token is not None:
                segment.t2w.add_tokens([lm_result.token])
            if lm_result.stream.finished:
                if segment.t2w.tokens:
                    segment.t2w.end()
                else:  # nothing to say (no text ids, or a stop token first)
                    self._segment_done()
            return None
        # token2wav
        segment = self.current
        assert segment is not None and segment.t2w is not None
        segment.chunks += 1
        if segment.t2w.done:
            self._segment_done()
        return result

    def segment_length_s(self) -> float | None:
        """Once the LM has stopped, the segment's tokens give its audio's length (approximate word times are
        spread over it)."""
        segment = self.current
        if segment is None or segment.lm is None or segment.t2w is None or not segment.lm.finished:
            return None
        token2wav = self.runner.model.token2wav
        samples = len(segment.t2w.tokens) * token2wav.token_mel_ratio * token2wav.hift.cfg.samples_per_frame
        return samples / self.voice.info.sample_rate

    def _segment_done(self) -> None:
        self.current = None
        self.segments_done += 1
