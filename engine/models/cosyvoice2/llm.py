"""The CosyVoice2 text-to-speech-token LM: a Qwen2 backbone with its own speech-token embedding
and output head.

Sequence fed to the backbone: [sos] + text embeddings (prompt text, then the text to speak) +
[task_id] + prompt speech-token embeddings; then one speech token per step. The head scores
``speech_token_size + 3`` ids: the speech tokens, then eos and two more ids that also end decoding.

Per-request state lives in an :class:`LMStream` (position, tokens so far, RNG, bounds) and in the stream's slot of
the module's KV pool (``kv_pool.py``: keys and values of every layer, and on the device the slot's length, last
token, token count and sampler window). The pool holds one slot per active stream, all of one length, on the
model's device; a stream takes a slot at its prefill and gives it back when it finishes or is dropped.

Continuous batching: :meth:`Qwen2LM.forward_step` (log-probabilities) and :meth:`Qwen2LM.step` (the chosen tokens)
run the pending inputs of any set of streams in ONE backbone pass. A call with a prefill (a prompt of many
positions) builds its indices on the host and attends with a per-stream causal mask; a decode call (one token per
stream) is made on the device from the pool alone: inputs from the slots' last tokens, RoPE positions from their
lengths, the new keys and values written in place at each slot's length, attention over the slots (one: a view of
its slot, unmasked; several: gathered, masked from their lengths), then the batched sampler
(``sampling.sample_batch``: top-k/top-p and repetition-aware, the min_len eos mask from the slots' token counts)
and the slots' state updated, with the chosen tokens as the step's one transfer to the host. On CUDA the decode
step runs at fixed batch and length buckets, captured as CUDA graphs (``cuda_graphs.py``). Streams join, finish
and are cancelled between calls freely. The decoder layers are the backbone's own modules (norms, projections,
MLP, rotary embedding); only the attention and the cache are ours.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2Config, Qwen2Model

from .config import LLMConfig
from .cuda_graphs import DecodeGraphs
from .kv_pool import SCRATCH, KVPool, PoolTensors
from .sampling import draws_per_step, new_generator, sample_batch

if TYPE_CHECKING:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

KV_BLOCK = 128
"""Slots are at least this many positions long, and grow in powers of two from it."""

Store = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(layer, new keys, new values [B, Hkv, N, hd]) -> the keys and values to attend to, after writing the new ones."""


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llm_dtype(device: torch.device) -> torch.dtype:
    """The LM's weights and activations: bf16 on CUDA (memory-bound decode), fp32 elsewhere (the CPU's numerics)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(eq=False)
class LMStream:
    """One request's decoding state."""

    pending: torch.Tensor | None
    """The prompt's embeddings [1, L, D] until the prefill has run; None after (the next input is the slot's last
    token, on the device)."""
    min_len: int
    max_len: int
    generator: torch.Generator
    position: int = 0
    """Positions already in the KV cache."""
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    slot: int | None = None
    """This stream's slot in the LM's KV pool (from its prefill until it finishes or is dropped)."""
    awaiting_token: bool = False
    """A step has run and its token is not chosen yet."""
    _pool: KVPool | None = field(default=None, repr=False)
    _release: weakref.finalize | None = field(default=None, repr=False)
    _device_min_len: int | None = field(default=None, repr=False)

    @property
    def kv(self) -> torch.Tensor | None:
        """A view of this stream's slot, [layers, 2, kv_heads, slot length, head_dim]; valid up to ``position``."""
        if self.slot is None or self._pool is None:
            return None
        return self._pool.kv[:, :, self.slot]


class Qwen2LM(nn.Module):
    def __init__(self, cfg: LLMConfig, backbone_config: Qwen2Config) -> None:
        super().__init__()
        self.cfg = cfg
        vocab = cfg.speech_token_size + 3
        self.eos = cfg.speech_token_size
        self.stop_tokens = frozenset(range(cfg.speech_token_size, vocab))
        self.llm_embedding = nn.Embedding(2, cfg.llm_input_size)  # row 0: sos, row 1: task_id
        self.speech_embedding = nn.Embedding(vocab, cfg.llm_input_size)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, vocab)
        self.backbone = Qwen2Model(backbone_config)
        c = backbone_config
        self.n_heads = c.num_attention_heads
        # Qwen2Config itself puts num_attention_heads in for a missing num_key_value_heads (no grouped queries).
        self.n_kv_heads: int = c.num_attention_heads if c.num_key_value_heads is None else c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        if getattr(c, "use_sliding_window", False) and getattr(c, "sliding_window", None):
            # Released CosyVoice2 (Qwen2.5-0.5B) attends to the whole sequence; a windowed backbone would
            # need the window in the mask below.
            raise ValueError("Qwen2 backbones with sliding-window attention are not supported")
        self.pool = KVPool(
            layers=c.num_hidden_layers,
            kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            max_positions=c.max_position_embeddings,
            window=cfg.sampling.win_size,
            min_length=KV_BLOCK,
        )
        self.decode_graphs: DecodeGraphs | None = None
        """Decode calls at fixed (padded) shapes, captured as CUDA graphs when it captures; None: exact shapes,
        eagerly (the CPU)."""
        self._slot_tensors: dict[tuple[int, ...], torch.Tensor] = {}
        self.forced_length: int | None = None
        """Benches only: every stream then makes exactly this many tokens (its bounds set at its prefill, every stop
        id masked), so timings do not depend on when random weights happen to stop."""

    @property
    def device(self) -> torch.device:
        return self.llm_decoder.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.llm_decoder.weight.dtype

    def use_decode_graphs(self, capture: bool) -> DecodeGraphs:
        """Run decode calls at bucketed, padded shapes from now on; as CUDA graphs when ``capture`` (CUDA only)."""
        if capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the LM on a CUDA device")
        self.decode_graphs = DecodeGraphs(self, capture)
        return self.decode_graphs

    def prompt_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_tokens: torch.Tensor
    ) -> torch.Tensor:
        """[1, L, D] backbone input for text ids [1, N] after prompt text ids [1, P] and prompt speech tokens [1, S]."""
        text_emb = self.backbone.embed_tokens(torch.cat([prompt_text, text], dim=1).long())
        parts = [self.llm_embedding.weight[0:1][None], text_emb, self.llm_embedding.weight[1:2][None]]
        if prompt_speech_tokens.shape[1] > 0:
            parts.append(self.speech_embedding(prompt_speech_tokens.long()))
        return torch.cat(parts, dim=1)

    @torch.inference_mode()
    def start(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor,
        prompt_speech_tokens: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        min_token_text_ratio: float = 2.0,
        max_token_text_ratio: float = 20.0,
    ) -> LMStream:
        """A new stream. Its length bounds scale with the text to speak (prompt text excluded).
        Without a ``generator`` the stream gets its own, seeded from OS entropy. It takes a KV slot at its first
        step (so its bounds may still change until then)."""
        n_text = text.shape[1]
        max_len = int(n_text * max_token_text_ratio)
        return LMStream(
            pending=self.prompt_embeddings(text, prompt_text, prompt_speech_tokens),
            min_len=int(n_text * min_token_text_ratio),
            max_len=max_len,
            generator=generator or new_generator(device=self.device),
            finished=max_len <= 0,
        )

    def release(self, stream: LMStream) -> None:
        """Give the stream's KV slot back now (it finished, or was cancelled); dropping the stream does it too."""
        if stream._release is not None:
            stream._release()
        stream._release = None
        stream.slot = None

    # -- steps --------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward_step(self, streams: Sequence[LMStream]) -> list[torch.Tensor]:
        """Run every stream's pending input through the backbone in one batched pass; return per stream
        the log-probabilities [V] of its next token (no masking). Advances each stream's KV cache."""
        if not streams:
            return []
        self._check(streams)
        with self._session(streams) as tensors:
            logp = self._logp(tensors, streams)
        return list(logp.unbind(0))

    @torch.inference_mode()
    def step(self, streams: Sequence[LMStream], greedy: bool = False) -> list[int | None]:
        """One step of every stream, as :meth:`forward_step` then :meth:`choose` but batched on the device: per
        stream its new token, or None where it stopped (a stop token, or ``max_len``)."""
        if not streams:
            return []
        self._check(streams)
        generators = None if greedy else [s.generator for s in streams]
        with self._session(streams) as tensors:
            self._sync_bounds(tensors, streams)
            graphs = self.decode_graphs
            decoding = all(s.pending is None for s in streams)
            positions = max(s.position for s in streams) + 1
            if decoding and graphs is not None and graphs.shapes(len(streams), positions, tensors) is not None:
                chosen = graphs.run(tensors, [cast(int, s.slot) for s in streams], positions, generators)
                for stream in streams:
                    stream.position += 1
            else:
                slots = self._slots(streams)
                logp = self._logp(tensors, streams)
                uniforms = None if generators is None else self._draw(generators)
                chosen = self._sample(tensors, logp, slots, uniforms).tolist()  # the step's one transfer to the host
        return [self._accept(stream, token) for stream, token in zip(streams, chosen, strict=True)]

    @torch.inference_mode()
    def choose(self, stream: LMStream, logp: torch.Tensor, greedy: bool = False) -> int | None:
        """Pick the next token from ``logp`` (this stream's :meth:`forward_step` result) with the batched sampler;
        append it and make it the next input, or return None (and mark the stream finished, its slot released) on
        a stop token or at ``max_len``."""
        if stream.finished:
            raise RuntimeError("stream already finished")
        if stream.slot is None:
            raise RuntimeError("choose needs the stream's forward_step first")
        with self.pool.session(self.device, self.dtype, held=[stream.slot]) as (_, tensors):
            self._sync_bounds(tensors, [stream])
            uniforms = None if greedy else self._draw([stream.generator])
            token = int(self._sample(tensors, logp[None], self._slots([stream]), uniforms)[0])
        return self._accept(stream, token)

    def generate(self, stream: LMStream, greedy: bool = False) -> Iterator[int]:
        """Decode ``stream`` to the end, one token per step."""
        while not stream.finished:
            (token,) = self.step([stream], greedy)
            if token is not None:
                yield token

    # -- host bookkeeping ---------------------------------------------------------------------------

    def _check(self, streams: Sequence[LMStream]) -> None:
        if len({id(s) for s in streams}) != len(streams):
            raise ValueError("a stream appears twice in one step")
        for s in streams:
            if s.finished:
                raise ValueError("a finished stream cannot step")
            if s.awaiting_token:
                raise RuntimeError("a stream's token must be chosen before its next step")

    @contextmanager
    def _session(self, streams: Sequence[LMStream]) -> Iterator[PoolTensors]:
        """Hold the pool for a step: slots for streams at their prefill, every slot long enough for the step; yields
        the pool's tensors the step uses."""
        fresh = [s for s in streams if s.slot is None]
        held = [s.slot for s in streams if s.slot is not None]
        positions = max(s.position + (1 if s.pending is None else s.pending.shape[1]) for s in streams)
        with self.pool.session(self.device, self.dtype, len(fresh), positions, held) as (slots, tensors):
            for stream, slot in zip(fresh, slots, strict=True):
                self._attach(tensors, stream, slot)
            yield tensors
        for stream in streams:
            stream.awaiting_token = True

    def _attach(self, tensors: PoolTensors, stream: LMStream, slot: int) -> None:
        if stream.pending is None:
            raise RuntimeError("a stream without a prompt and without a KV slot")
        stream.slot, stream._pool = slot, self.pool
        stream._release = weakref.finalize(stream, self.pool.release, slot)
        stream._release.atexit = False
        if self.forced_length is not None:
            stream.min_len = stream.max_len = self.forced_length
        tensors.start(slot, stream.tokens, stream.min_len)
        stream._device_min_len = stream.min_len

    def _sync_bounds(self, tensors: PoolTensors, streams: Sequence[LMStream]) -> None:
        """The device's copy of each stream's min_len, where the host's changed since its prefill (rare)."""
        for s in streams:
            if s._device_min_len != s.min_len and s.slot is not None:
                tensors.min_len[s.slot] = s.min_len
                s._device_min_len = s.min_len

    def _accept(self, stream: LMStream, token: int) -> int | None:
        stream.awaiting_token = False
        if token in self.stop_tokens:
            stream.finished = True
            self.release(stream)
            return None
        stream.tokens.append(token)
        if len(stream.tokens) >= stream.max_len:
            stream.finished = True
            self.release(stream)
        return token

    def _slots(self, streams: Sequence[LMStream]) -> torch.Tensor:
        """The streams' slots as a device tensor, made once per set of streams (decode calls repeat them)."""
        key = tuple(cast(int, s.slot) for s in streams)
        slots = self._slot_tensors.get(key)
        if slots is None or slots.device != self.device:
            if len(self._slot_tensors) >= 256:  # a bound on the cache, not a tuning: any size works
                self._slot_tensors.clear()
            slots = self._slot_tensors[key] = torch.tensor(key, dtype=torch.long, device=self.device)
        return slots

    @property
    def draws(self) -> int:
        """Uniforms the sampler takes per stream and step (``sampling.draws_per_step``)."""
        return draws_per_step(self.llm_decoder.out_features)

    def _draw(self, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """[B, draws] uniforms, each row from its stream's own generator (one small op per row, no host sync)."""
        uniforms = torch.empty(len(generators), self.draws, device=self.device)
        for row, generator in enumerate(generators):
            uniforms[row].uniform_(generator=generator)
        return uniforms

    # -- device work --------------------------------------------------------------------------------

    def _logp(self, tensors: PoolTensors, streams: Sequence[LMStream]) -> torch.Tensor:
        """[B, V] log-probabilities of each stream's next token; advances the streams' positions."""
        if all(s.pending is None for s in streams):
            slots = self._slots(streams)
            length = max(s.position for s in streams) + 1
            single = streams[0].slot if len(streams) == 1 else None
            logits = self._decode_logits(tensors, slots, length, single)
            for stream in streams:
                stream.position += 1
        else:
            logits = self._prefill_logits(tensors, streams)
        return F.log_softmax(logits, dim=-1)

    def decode_sample(
        self, tensors: PoolTensors, slots: torch.Tensor, length: int, uniforms: torch.Tensor | None
    ) -> torch.Tensor:
        """The whole decode step of the streams in ``slots`` [B] (padding rows: the scratch slot), attending over
        ``length`` positions, on the device with no host sync (so a CUDA graph can hold it): the chosen tokens [B]
        (greedy when ``uniforms`` is None), with each slot's state advanced."""
        logp = F.log_softmax(self._decode_logits(tensors, slots, length, None), dim=-1)
        return self._sample(tensors, logp, slots, uniforms)

    def _decode_logits(
        self, tensors: PoolTensors, slots: torch.Tensor, length: int, single: int | None
    ) -> torch.Tensor:
        """[B, V] fp32 logits of one new position per slot: the input is each slot's last token, at its length,
        attending to ``length`` positions masked from the slots' lengths. ``single``: the one slot of a one-stream
        call (attends to a view of its slot); otherwise the slots are gathered."""
        kv = tensors.kv
        position = tensors.lengths[slots]  # [B]
        x = self.speech_embedding(tensors.last_token[slots])[:, None]  # [B, 1, D]
        # Masked even where nothing is hidden (one stream, exact length): the same kernel as a batch's, so a stream's
        # row of a batch equals its solo step bit for bit (random weights make near-ties that a last bit flips).
        mask = (torch.arange(length, device=slots.device) <= position[:, None])[:, None, None]  # [B, 1, 1, T]

        def store(index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = kv[index, 0], kv[index, 1]  # [slots, Hkv, slot length, hd]
            keys[slots, :, position] = k[:, :, 0]
            values[slots, :, position] = v[:, :, 0]
            if single is not None:
                return keys[single : single + 1, :, :length], values[single : single + 1, :, :length]
            return keys[slots, :, :length], values[slots, :, :length]

        x = self._layers(x, position[:, None], store, mask)
        tensors.lengths[slots] = torch.where(slots == SCRATCH, 0, position + 1)  # padding rows stay at 0
        return self.llm_decoder(self.backbone.norm(x[:, 0])).float()

    def _prefill_logits(self, tensors: PoolTensors, streams: Sequence[LMStream]) -> torch.Tensor:
        """[B, V] fp32 logits after each stream's pending inputs (a prompt, or one token), of any lengths."""
        kv = tensors.kv
        device = self.device
        inputs = [self._pending(tensors, s) for s in streams]
        lengths = [x.shape[0] for x in inputs]
        past_list = [s.position for s in streams]
        n_new, total = max(lengths), max(p + n for p, n in zip(past_list, lengths, strict=True))
        batch = len(streams)
        x = inputs[0][None] if batch == 1 else nn.utils.rnn.pad_sequence(inputs, batch_first=True)  # [B, N, D]
        slots = self._slots(streams)
        past = torch.tensor(past_list, device=device)
        positions = past[:, None] + torch.arange(n_new, device=device)[None]  # [B, N]
        # Where each new position goes: rows and positions of the valid (unpadded) inputs (built on the
        # host, one transfer each: no per-stream kernels on a GPU).
        rows = torch.tensor([b for b, n in enumerate(lengths) for _ in range(n)], device=device)
        cols = torch.tensor([i for n in lengths for i in range(n)], device=device)  # index into the new inputs
        dest = torch.tensor([p + i for p, n in zip(past_list, lengths, strict=True) for i in range(n)], device=device)
        dest_slots = slots[rows]
        single = streams[0].slot if batch == 1 else None

        def store(index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = kv[index, 0], kv[index, 1]
            keys[dest_slots, :, dest] = k.transpose(1, 2)[rows, cols]
            values[dest_slots, :, dest] = v.transpose(1, 2)[rows, cols]
            if single is not None:
                return keys[single : single + 1, :, :total], values[single : single + 1, :, :total]
            return keys[slots, :, :total], values[slots, :, :total]

        x = self._layers(x, positions, store, self._allowed(past, n_new, total))
        new_lengths = [p + n for p, n in zip(past_list, lengths, strict=True)]
        tensors.lengths[slots] = torch.tensor(new_lengths, device=device)
        last = torch.tensor(lengths, device=device) - 1
        hidden = self.backbone.norm(x[torch.arange(batch, device=device), last])  # [B, D]
        for stream, position in zip(streams, new_lengths, strict=True):
            stream.position, stream.pending = position, None
        return self.llm_decoder(hidden).float()

    def _pending(self, tensors: PoolTensors, stream: LMStream) -> torch.Tensor:
        """[L, D] the stream's next inputs: its prompt, or the embedding of its last token (on the device)."""
        if stream.pending is not None:
            return stream.pending[0]
        slot = cast(int, stream.slot)
        return self.speech_embedding(tensors.last_token[slot : slot + 1])

    def _allowed(self, past: torch.Tensor, new: int, total: int) -> torch.Tensor:
        """[B, 1, new, total] bool: key ``j`` is visible to new position ``i`` of row ``b`` iff
        ``j <= past[b] + i`` (its own cache and itself, causally; never padding)."""
        query_pos = past[:, None] + torch.arange(new, device=past.device)[None]  # [B, N]
        keys = torch.arange(total, device=past.device)
        return (keys[None, None, :] <= query_pos[:, :, None])[:, None]

    def _layers(
        self, x: torch.Tensor, positions: torch.Tensor, store: Store, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The decoder layers on ``x`` [B, N, D] at RoPE ``positions`` [B, N]; ``store`` writes each layer's new keys
        and values into the pool and returns what to attend to."""
        batch, n_new = x.shape[:2]
        cos, sin = self.backbone.rotary_emb(x, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, N, hd]
        layers = cast("Sequence[Qwen2DecoderLayer]", self.backbone.layers)  # the ModuleList Qwen2Model builds
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, n_new, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, n_new, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(batch, n_new, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = store(index, k, v)
            if n_new == 1:
                # One query per stream: the query heads that share a KV head become its query rows, so attention
                # needs no grouped-query support (which rules out the fused masked kernels) and no repeated keys.
                grouped = q.reshape(batch, self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim)
                out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
                out = out.reshape(batch, self.n_heads, 1, self.head_dim)
            else:
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, enable_gqa=self.n_heads != self.n_kv_heads
                )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, n_new, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def _sample(
        self, tensors: PoolTensors, logp: torch.Tensor, slots: torch.Tensor, uniforms: torch.Tensor | None
    ) -> torch.Tensor:
        """[B] tokens from ``logp`` [B, V] of the streams in ``slots`` (greedy without ``uniforms``), and each slot's
        state advanced by its token; on the device."""
        # Too short to end: mask eos. As in the reference, the two other stop ids stay open; the trained model
        # does not produce them.
        too_short = tensors.n_tokens[slots] < tensors.min_len[slots]
        is_eos = torch.arange(logp.shape[-1], device=logp.device) == self.eos
        scores = logp.masked_fill(too_short[:, None] & is_eos, float("-inf"))
        if self.forced_length is not None:
            scores = scores.masked_fill(torch.arange(logp.shape[-1], device=logp.device) >= self.eos, float("-inf"))
        if uniforms is None:
            tokens = scores.argmax(dim=-1)
        else:
            tokens = sample_batch(scores, uniforms, tensors.window[slots], self.cfg.sampling)
        tensors.record(slots, tokens)
        return tokens
