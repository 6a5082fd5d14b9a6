"""CosyVoice2 at scale: batched LM steps, batched token-to-wave, the TensorRT estimator, and the whole engine
under concurrent streams, batched scheduler against one request at a time.

    python -m bench.cosyvoice2_scale                 # a GPU: released CosyVoice2-0.5B sizes, random weights
    python -m bench.cosyvoice2_scale --quick         # the same, fewer levels and repeats (about half the time)
    python -m bench.cosyvoice2_scale --tiny          # the CPU: the test fixture (RTVOICE_COSYVOICE2_FIXTURE)

Without ``--tiny`` a model directory with the released sizes (Qwen2.5-0.5B backbone: hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocabulary 151936; flow and HiFT as in the released
``cosyvoice2.yaml``) is written to a temporary directory with RANDOM weights: speed does not depend on the
weights' values. Every request is forced to ``--tokens`` (250) speech tokens: stop tokens are masked.

Sections (each prints a table):

1. LM step: one batched ``forward_step`` of N decoding streams against N single-stream steps;
   prefill of N prompts in one call against one by one.
2. token2wav: cost of each streaming chunk against the utterance's length (the flow re-runs over the
   whole prefix each chunk); a batch of N streams' chunks against the same chunks one by one.
3. Estimator: one call at 1/4/8/16 streams (2x rows with CFG), torch against TensorRT fp16 (GPU with the
   ``trt`` extra only), and the fp16 engine's SNR against torch fp32.
4. Engine: 1/4/8/16 concurrent streams through the real scheduler and runner: first-chunk latency p50/p95
   and aggregate real-time factor (wall time / audio produced; below 1 is faster than real time), batched
   scheduler against one request at a time (one active stream, batch size 1).

``--budget-s`` bounds the whole run: a section that would start past it is skipped and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

try:
    import torch
except ImportError:  # pragma: no cover - the cosyvoice extra is needed
    sys.exit("bench.cosyvoice2_scale needs torch and transformers (pip install -e '.[cosyvoice]')")

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.request import SynthesisRequest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURE = REPO.parent / "shared" / "fixtures" / "cosyvoice2-tiny"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."

# The released CosyVoice2-0.5B configuration's sizes (the yaml's layout, as the loader reads it).
RELEASED_YAML = """\
sample_rate: 24000
llm_input_size: 896
llm_output_size: 896
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1
llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512
        attention_heads: 8
        linear_units: 2048
        num_blocks: 6
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [256]
            dropout: 0.0
            attention_head_dim: 64
            n_blocks: 4
            num_mid_blocks: 12
            num_heads: 8
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: 512
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 512
"""

QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "attention_dropout": 0.0,
    "torch_dtype": "float32",
}


# -- model ----------------------------------------------------------------------------------------


def build_released_model_dir(root: Path, seed: int = 0) -> Path:
    """A model directory with the released sizes and random weights (written as fp16 to halve the I/O)."""
    from transformers import Qwen2Config

    from rtvoice.engine.models.cosyvoice2.config import load_config
    from rtvoice.engine.models.cosyvoice2.flow import CausalMaskedDiffWithXvec
    from rtvoice.engine.models.cosyvoice2.hift import HiFTGenerator
    from rtvoice.engine.models.cosyvoice2.llm import Qwen2LM

    root.mkdir(parents=True, exist_ok=True)
    (root / "cosyvoice2.yaml").write_text(RELEASED_YAML)
    qwen = root / "CosyVoice-BlankEN"
    qwen.mkdir(exist_ok=True)
    (qwen / "config.json").write_text(json.dumps(QWEN_CONFIG, indent=1))
    cfg = load_config(root / "cosyvoice2.yaml")
    torch.manual_seed(seed)
    with torch.device("cpu"):
        llm = Qwen2LM(cfg.llm, Qwen2Config.from_json_file(str(qwen / "config.json")))
        state = {}
        for key, value in llm.state_dict().items():
            key = "llm.model.model." + key[len("backbone.") :] if key.startswith("backbone.") else key
            state[key] = value.half()
        torch.save(state, root / "llm.pt")
        del llm, state
        flow = CausalMaskedDiffWithXvec(cfg.flow, lookahead_hidden=512, num_up_blocks=4)
        torch.save({k: v.half() for k, v in flow.state_dict().items()}, root / "flow.pt")
        hift = HiFTGenerator(cfg.hift, f0_num_convs=5, f0_kernel_size=3, pre_kernel=7, post_kernel=7)
        hift_state = {k: v for k, v in hift.state_dict().items()}
        torch.save(hift_state, root / "hift.pt")
    return root


def force_tokens(llm: Any, n_tokens: int) -> None:
    """Every stream makes exactly ``n_tokens`` speech tokens (``Qwen2LM.forced_length``: stop ids masked, length
    fixed at its prefill), on the batched device path as on the per-stream one."""
    llm.forced_length = n_tokens


def bench_voice(service: Any, prompt_tokens: int, seed: int = 0) -> Any:
    """A zero-shot voice with a random prompt of ``prompt_tokens`` speech tokens (and its mel and text)."""
    from rtvoice.engine.models.cosyvoice2.frontend import PromptFeatures

    g = torch.Generator().manual_seed(seed)
    mel_bins = service.mel_bins
    features = PromptFeatures(
        embedding=torch.randn(1, service.model.config.flow.spk_embed_dim, generator=g),
        speech_tokens=torch.randint(0, 6561, (1, prompt_tokens), generator=g, dtype=torch.int32),
        speech_feat=torch.randn(1, 2 * prompt_tokens, mel_bins, generator=g) - 6,
        prompt_text="A prompt.",
        prompt_text_ids=torch.tensor([list(b"A short prompt sentence.")], dtype=torch.int32),
    )
    return service.make_voice("bench", features, name="bench", mode="zero_shot")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs (after ``warmup``)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    print(f"\n## {title}\n")
    cells = [[str(c) for c in header]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")
    sys.stdout.flush()


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    @property
    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def allows(self, name: str, needs_s: float = 0.0) -> bool:
        if self.left > needs_s:
            return True
        print(f"\n## {name}\n\nskipped: {self.left:.0f} s of the --budget-s left, about {needs_s:.0f} s needed")
        return False


# -- 1. LM steps ----------------------------------------------------------------------------------


def lm_streams(service: Any, voice: Any, n: int, decode_steps: int) -> list[Any]:
    """``n`` streams, prefilled and ``decode_steps`` tokens in (so their caches have realistic lengths)."""
    from rtvoice.engine.models.cosyvoice2.frontend import ids_tensor

    llm = service.model.llm
    streams = []
    for i in range(n):
        text = ids_tensor(service.frontend.text_ids(TEXT[: 40 + 3 * i]), service.device)
        s = llm.start(
            text,
            voice.lm_prompt.text_ids,
            voice.lm_prompt.speech_tokens,
            generator=torch.Generator(device=service.device).manual_seed(i),
        )
        streams.append(s)
    for s, logp in zip(streams, llm.forward_step(streams), strict=True):
        llm.choose(s, logp)
    for _ in range(decode_steps):
        for s, logp in zip(streams, llm.forward_step(streams), strict=True):
            llm.choose(s, logp)
    return streams


def bench_lm(service: Any, voice: Any, sizes: list[int], repeats: int, results: dict[str, Any]) -> None:
    llm, device = service.model.llm, service.device
    rows = []
    for n in sizes:
        streams = lm_streams(service, voice, n, decode_steps=20)

        def batched(streams: list[Any] = streams) -> None:
            for s, logp in zip(streams, llm.forward_step(streams), strict=True):
                llm.choose(s, logp)

        def single(streams: list[Any] = streams) -> None:
            for s in streams:
                llm.choose(s, llm.forward_step([s])[0])

        b = timed(batched, device, repeats)
        u = timed(single, device, repeats)
        rows.append([n, b * 1e3, u * 1e3, b * 1e3 / n, u / b])
        results.setdefault("lm_decode", []).append({"streams": n, "batched_ms": b * 1e3, "single_ms": u * 1e3})
    table(
        "LM decode step: one batched call vs one call per stream",
        ["streams", "batched ms", "one by one ms", "batched ms/stream", "speed-up"],
        rows,
    )

    from rtvoice.engine.models.cosyvoice2.frontend import ids_tensor

    rows = []
    for n in sizes:

        def fresh(n: int = n) -> list[Any]:
            return [
                llm.start(
                    ids_tensor(service.frontend.text_ids(TEXT[: 40 + 3 * i]), device),
                    voice.lm_prompt.text_ids,
                    voice.lm_prompt.speech_tokens,
                )
                for i in range(n)
            ]

        b = timed(lambda: llm.forward_step(fresh()), device, repeats)
        u = timed(lambda: [llm.forward_step([s]) for s in fresh()], device, repeats)
        rows.append([n, b * 1e3, u * 1e3, u / b])
        results.setdefault("lm_prefill", []).append({"streams": n, "batched_ms": b * 1e3, "single_ms": u * 1e3})
    length = fresh()[0].pending.shape[1]
    table(
        f"LM prefill ({length}-position prompts, padded per call): one batched call vs one by one",
        ["streams", "batched ms", "one by one ms", "speed-up"],
        rows,
    )


# -- 2. token2wav ---------------------------------------------------------------------------------


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def bench_token2wav_growth(service: Any, voice: Any, n_tokens: int, results: dict[str, Any]) -> None:
    """Per-chunk cost along one utterance: the flow re-runs over prompt + every token so far."""
    t2w, device = service.model.token2wav, service.device
    stream = t2w.stream(voice.flow_prompt, torch.Generator(device=device).manual_seed(0))
    stream.add_tokens(random_tokens(n_tokens, 0))
    stream.end()
    rows = []
    warm = t2w.stream(voice.flow_prompt, torch.Generator(device=device).manual_seed(0))
    warm.add_tokens(random_tokens(60, 1))
    warm.step()
    while stream.ready():
        upto = min(len(stream.tokens), stream.token_offset + stream._this_hop + t2w.pre_lookahead)
        sync(device)
        start = time.perf_counter()
        chunk = stream.step()
        sync(device)
        seconds = time.perf_counter() - start
        audio_s = chunk.shape[1] / service.sample_rate
        rows.append(
            [upto, voice.flow_prompt.tokens.shape[1] + upto, audio_s, seconds * 1e3, seconds * 1e3 / max(audio_s, 1e-9)]
        )
    results["token2wav_growth"] = [
        dict(zip(["tokens", "flow_tokens", "audio_s", "ms", "ms_per_audio_s"], r, strict=True)) for r in rows
    ]
    table(
        f"token2wav chunks along one {n_tokens}-token utterance (prompt {voice.flow_prompt.tokens.shape[1]} "
        "tokens): the flow re-runs over the whole prefix",
        ["tokens so far", "flow input tokens", "chunk audio s", "chunk ms", "ms per audio s"],
        rows,
    )


def bench_token2wav_batch(service: Any, voice: Any, sizes: list[int], repeats: int, results: dict[str, Any]) -> None:
    """Steady-state chunks (the same hop) of N streams: one batched call vs one call each."""
    t2w, device = service.model.token2wav, service.device

    def streams(n: int) -> list[Any]:
        out = []
        for i in range(n):
            s = t2w.stream(voice.flow_prompt, torch.Generator(device=device).manual_seed(i))
            s.add_tokens(random_tokens(200, 10 + i))
            s.step()  # past the first (padded) hop: the next chunks are 50-token hops for every stream
            out.append(s)
        return out

    def snapshot(ss: list[Any]) -> list[dict[str, Any]]:
        return [dict(vars(s)) for s in ss]

    def restore(ss: list[Any], states: list[dict[str, Any]]) -> None:
        for s, state in zip(ss, states, strict=True):
            s.__dict__.update(state)

    rows = []
    for n in sizes:
        ss = streams(n)
        states = snapshot(ss)

        def batched(ss: list[Any] = ss, states: list[dict[str, Any]] = states) -> None:
            restore(ss, states)
            t2w.step_many(ss)

        def single(ss: list[Any] = ss, states: list[dict[str, Any]] = states) -> None:
            restore(ss, states)
            for s in ss:
                t2w.step_many([s])

        b = timed(batched, device, repeats)
        u = timed(single, device, repeats)
        rows.append([n, b * 1e3, u * 1e3, u / b])
        results.setdefault("token2wav_batch", []).append({"streams": n, "batched_ms": b * 1e3, "single_ms": u * 1e3})
    table(
        "token2wav chunk (50-token hop) of N streams: one batched call vs one call per stream",
        ["streams", "batched ms", "one by one ms", "speed-up"],
        rows,
    )


# -- 3. estimator ---------------------------------------------------------------------------------


def bench_estimator(
    service: Any, sizes: list[int], frames: int, repeats: int, optimization_level: int | None, results: dict[str, Any]
) -> Any:
    """Returns the fp16 engine (None without TensorRT) for the engine section to reuse."""
    from rtvoice.engine.models.cosyvoice2 import trt

    device = service.device
    estimator = service.model.flow.decoder.estimator
    reason = trt.unavailable_reason(device)
    engine = None
    note = ""
    if reason is None:
        start = time.perf_counter()
        try:
            data, path, built = trt.load_or_build(
                estimator,
                trt.cache_dir(service.model_dir, None),
                "fp16",
                trt.Profile(max_batch=max(sizes)),
                device,
                optimization_level,
            )
            engine = trt.TrtEstimator(
                data, "fp16", trt.Profile(max_batch=max(sizes)), device, 2, estimator.forward_masked
            )
            note = f"engine {path.name}, {'built' if built else 'cached'} in {time.perf_counter() - start:.0f} s"
        except Exception as error:  # report and go on with torch: the other sections still mean something
            reason = f"the fp16 engine failed after {time.perf_counter() - start:.0f} s: {error}"
    rows = []
    for n in sizes:
        args = trt.example_inputs(estimator, batch=2 * n, frames=frames, device=device, seed=n)
        lengths, chunks = args[5].long(), args[6].long()
        with torch.inference_mode():
            torch_s = timed(partial(estimator.forward_masked, *args[:5], lengths, chunks), device, repeats)
            row: list[Any] = [n, 2 * n, torch_s * 1e3]
            entry: dict[str, Any] = {"streams": n, "torch_ms": torch_s * 1e3}
            if engine is not None:
                trt_s = timed(partial(engine, *args), device, repeats)
                snr = trt.snr_db(estimator.forward_masked(*args[:5], lengths, chunks), engine(*args))
                row += [trt_s * 1e3, torch_s / trt_s, snr]
                entry.update(trt_fp16_ms=trt_s * 1e3, snr_db=snr)
            else:
                row += ["-", "-", "-"]
        rows.append(row)
        results.setdefault("estimator", []).append(entry)
    table(
        f"Flow estimator, one call at {frames} frames: torch vs TensorRT fp16"
        + (f" ({note})" if note else f" (TensorRT skipped: {reason})"),
        ["streams", "rows (CFG)", "torch ms", "TRT fp16 ms", "speed-up", "fp16 SNR dB"],
        rows,
    )
    return engine


# -- 4. engine --------------------------------------------------------------------------------------


async def run_level(
    service: Any, voice: Any, n: int, batched: bool, runner_threads: int, budget_s: float = math.inf
) -> dict[str, Any]:
    """``n`` concurrent streams through the engine; past ``budget_s`` the level stops and reports what it made."""
    from rtvoice.engine.engine import Engine
    from rtvoice.engine.settings import EngineSettings
    from rtvoice.engine.voices import VoiceRegistry

    registry = VoiceRegistry([voice])
    registry.cosyvoice = service
    settings = EngineSettings(
        warmup=False,
        runner_threads=runner_threads,
        max_batch_size=64 if batched else 1,
        max_active_streams=max(n, 1) if batched else 1,
        max_queued_streams=max(n, 1) + 8,
        max_buffered_audio_s=3600.0,
    )
    engine = Engine(settings, voices=registry)
    await engine.start()
    try:
        firsts: dict[int, float] = {}
        samples: dict[int, int] = {}

        async def one(seed: int) -> None:
            start = time.perf_counter()
            stream = engine.open_stream(
                SynthesisRequest(text=TEXT, voice=voice.info.id, options=SynthesisOptions(seed=seed))
            )
            samples[seed] = 0
            try:
                async for pcm in stream.audio():
                    firsts.setdefault(seed, time.perf_counter() - start)
                    samples[seed] += len(pcm)
            finally:
                stream.cancel()

        start = time.perf_counter()
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), budget_s)
        except TimeoutError:
            timed_out = True
        wall = time.perf_counter() - start
        sizes = [len(d.stream_ids) for d in engine.scheduler.decisions if d.kind == "lm"]
    finally:
        await engine.stop()
    # A stream with no audio by the end counts as waiting the whole level.
    waits = sorted(firsts.get(i, wall) for i in range(n))
    audio_s = sum(samples.values()) / service.sample_rate
    return {
        "streams": n,
        "mode": ("batched" if batched else "one at a time")
        + (f" (stopped at its {budget_s:.0f} s)" if timed_out else ""),
        "first_p50_ms": 1e3 * pct(waits, 50),
        "first_p95_ms": 1e3 * pct(waits, 95),
        "wall_s": wall,
        "audio_s": audio_s,
        "rtf": wall / audio_s if audio_s else math.inf,
        "mean_lm_batch": statistics.mean(sizes) if sizes else 0.0,
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    k = (len(values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def bench_engine(
    service: Any,
    voice: Any,
    levels: list[int],
    runner_threads: int,
    budget: Budget,
    results: dict[str, Any],
    serial: bool = True,
) -> None:
    rows = []
    single_s = None
    # Each level gets its own share of what is left, so a slow level cannot starve the next.
    runs = [(n, batched) for n in levels for batched in (True, False) if batched or serial]
    for index, (n, batched) in enumerate(runs):
        share_s = budget.left / (len(runs) - index)
        # one at a time costs about n x one stream: skip what cannot finish within the budget
        need = (single_s or 0) * (n if not batched else max(1, n / 4)) * 1.2
        if budget.left < need or share_s <= 0:
            rows.append([n, "batched" if batched else "one at a time", "skipped (budget)", "", "", "", ""])
            continue
        r = asyncio.run(run_level(service, voice, n, batched, runner_threads, share_s))
        if n == 1 and batched:
            single_s = r["wall_s"]
        results.setdefault("engine", []).append(r)
        rows.append(
            [
                n,
                r["mode"],
                r["first_p50_ms"],
                r["first_p95_ms"],
                r["rtf"],
                r["audio_s"] / r["wall_s"],
                r["mean_lm_batch"],
            ]
        )
    table(
        "Engine: concurrent streams, each forced to the same tokens; first-chunk latency and aggregate RTF",
        ["streams", "scheduler", "first chunk p50 ms", "p95 ms", "RTF (wall/audio)", "audio s per s", "mean LM batch"],
        rows,
    )


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the CPU test fixture instead of released sizes")
    parser.add_argument("--model-dir", type=Path, help="an existing model directory (instead of random weights)")
    parser.add_argument("--device", default=None, help="cuda (default) or cpu; --tiny defaults to cpu")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, levels and repeats")
    parser.add_argument("--tokens", type=int, default=250, help="speech tokens per request (stop tokens masked)")
    parser.add_argument("--prompt-tokens", type=int, default=75, help="prompt speech tokens (3 s)")
    parser.add_argument("--levels", type=int, nargs="*", help="concurrent streams (default 1 4 8 16)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per call (CPU)")
    parser.add_argument("--runner-threads", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("RTVOICE_BENCH_BUDGET_S", 440)))
    parser.add_argument("--trt-opt-level", type=int, default=None, help="TensorRT builder optimisation level")
    parser.add_argument("--skip", nargs="*", default=[], choices=["lm", "token2wav", "estimator", "engine"])
    parser.add_argument(
        "--no-serial", action="store_true", help="engine levels batched only, not also one request at a time"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    budget = Budget(args.budget_s)

    device_name = args.device or ("cpu" if args.tiny else "cuda")
    if device_name.startswith("cuda") and not torch.cuda.is_available():
        print(
            "error: CUDA is not available to torch (a CPU build, no GPU, or no driver). Run on a GPU machine "
            "with a CUDA build of torch, or use --tiny (the CPU fixture) or --device cpu.",
            file=sys.stderr,
        )
        return 2
    device = torch.device(device_name)
    torch.set_num_threads(max(1, args.threads))

    from rtvoice.engine.models.cosyvoice2.service import CosyVoice2Service

    tmp = None
    if args.model_dir is not None:
        model_dir = args.model_dir
    elif args.tiny:
        model_dir = Path(os.environ.get("RTVOICE_COSYVOICE2_FIXTURE", str(DEFAULT_FIXTURE)))
        if not (model_dir / "cosyvoice2.yaml").is_file():
            print(f"error: no CosyVoice2 fixture at {model_dir} (set RTVOICE_COSYVOICE2_FIXTURE)", file=sys.stderr)
            return 2
    else:
        tmp = tempfile.TemporaryDirectory(prefix="rtvoice-cosyvoice2-")
        start = time.perf_counter()
        model_dir = build_released_model_dir(Path(tmp.name) / "CosyVoice2-0.5B-random")
        print(f"released-size model with random weights written to {model_dir} in {time.perf_counter() - start:.0f} s")
    start = time.perf_counter()
    service = CosyVoice2Service.load(
        model_dir,
        None,
        device=device_name,
        threads=args.threads,
        estimator="torch",
        token2wav_batch=16,
        data_dir=Path(tempfile.gettempdir()) / "rtvoice-bench",
        concurrent_calls=args.runner_threads,
    )
    print(
        f"loaded {model_dir} on {device} in {time.perf_counter() - start:.0f} s; torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    )
    force_tokens(service.model.llm, args.tokens)
    voice = bench_voice(service, args.prompt_tokens)
    results: dict[str, Any] = {"device": str(device), "model_dir": str(model_dir), "tokens": args.tokens}

    quick = args.quick
    repeats = 3 if quick else 5
    sizes = [1, 2, 4, 8] if device.type == "cpu" else [1, 4, 8, 16]
    levels = args.levels or ([1, 4, 16] if quick else [1, 4, 8, 16])
    try:
        if "lm" not in args.skip and budget.allows("LM steps", 10):
            bench_lm(service, voice, sizes, repeats, results)
        if "token2wav" not in args.skip and budget.allows("token2wav", 20):
            bench_token2wav_growth(service, voice, 600 if not quick else 400, results)
            bench_token2wav_batch(service, voice, sizes, max(2, repeats - 2), results)
        engine = None
        if "estimator" not in args.skip and budget.allows("Estimator", 120 if device.type == "cuda" else 10):
            engine = bench_estimator(service, [1, 4, 8, 16], 500, repeats, args.trt_opt_level, results)
        if "engine" not in args.skip and budget.allows("Engine", 20):
            cfm = service.model.flow.decoder
            if engine is not None:
                # The scheduler's token2wav batches run on the fp16 engine built above (with the torch fp32
                # re-run should a call come out non-finite), whatever its SNR on random weights.
                cfm.accelerated, cfm.fp32_fallback = engine, cfm.estimator.forward_masked
            print(
                f"\nengine runs: estimator on {'TensorRT fp16' if cfm.accelerated is not None else 'torch'}, "
                f"token2wav batches up to {service.token2wav_batch}, {args.runner_threads} runner threads"
            )
            service.warmup()
            bench_engine(service, voice, levels, args.runner_threads, budget, results, serial=not args.no_serial)
    finally:
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        if tmp is not None:
            tmp.cleanup()
    print(f"\ntotal {time.monotonic() - budget.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
