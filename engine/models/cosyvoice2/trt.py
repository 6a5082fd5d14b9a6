"""The flow decoder's estimator on TensorRT (the ``trt`` extra), with torch as the fallback everywhere.

The estimator (a U-Net with transformer blocks) runs 10 Euler steps x 2 (classifier-free guidance) per
flow call, so it dominates token-to-wave time. Here it is:

1. exported to ONNX (opset 18) through :class:`MaskedEstimator`, the estimator's masked call with
   dynamic batch and length: inputs ``x, mu, cond`` [B, 80, T], ``t`` [B], ``spks`` [B, 80], ``lengths``
   and ``chunks`` [B] int32 (valid frames and attention chunk per row; 0 = full attention), output
   ``velocity`` [B, 80, T]; the attention mask is built inside the graph from those;
2. built into a TensorRT engine (fp16 or fp32) with one optimisation profile covering batch 2 (one
   stream and its unconditioned twin) to ``2 x`` the token-to-wave batch limit, and 4 to ``MAX_FRAMES``
   frames;
3. cached beside the model (``<model dir>/trt/``) or, when that is read-only, under
   ``<data dir>/trt/<model hash>/``, in a file named by the GPU, the TensorRT version, the precision,
   the profile and a fingerprint of the weights, so a different GPU or TensorRT never loads a stale
   engine;
4. run from a pool of execution contexts (one per concurrent caller: runner threads), with torch CUDA
   tensors as inputs and outputs and ``execute_async_v3`` on the caller's current stream: nothing waits
   for the GPU inside the Euler loop. Each context carries the event of its last run, and the next user's
   stream waits on it (on the GPU), so contexts move between threads and streams safely.

Shapes outside the profile (a longer utterance, a larger batch) run on torch. fp16 engines are checked
against torch fp32 once at set-up (SNR in dB); NaN or infinite output (reported by users of the
reference's fp16 engines) makes the service use fp32 instead, with a warning, and a flow call that
still produces non-finite output is re-run on fp32.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .estimator import CausalConditionalDecoder

log = logging.getLogger(__name__)

BACKENDS = ("torch", "trt-fp16", "trt-fp32", "auto")
ONNX_OPSET = 18
INPUT_NAMES = ("x", "mu", "t", "spks", "cond", "lengths", "chunks")
OUTPUT_NAME = "velocity"
MAX_FRAMES = 3000
"""Longest flow input (prompt included) the engines' profile covers: 60 s of mel at 50 frames/s."""
MIN_FRAMES = 4
OPT_FRAMES = 500
FP16_MIN_SNR_DB = 20.0
"""Below this SNR against torch fp32 an fp16 engine is not used (fp32 instead)."""
WORKSPACE_BYTES = 8 << 30


class MaskedEstimator(nn.Module):
    """The estimator's masked call with int32 lengths and chunks: the graph that is exported."""

    def __init__(self, estimator: CausalConditionalDecoder) -> None:
        super().__init__()
        self.estimator = estimator

    def forward(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        lengths: torch.Tensor,
        chunks: torch.Tensor,
    ) -> torch.Tensor:
        return self.estimator.forward_masked(x, mu, t, spks, cond, lengths.long(), chunks.long())


EstimatorInputs = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]
"""The masked call's inputs, in ``INPUT_NAMES`` order."""


def example_inputs(
    estimator: CausalConditionalDecoder,
    batch: int = 2,
    frames: int = 120,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> EstimatorInputs:
    """Inputs of the estimator's masked call: two halves as CFG makes them (the second unconditioned),
    the first row streaming in chunks, the others with full attention and shorter valid lengths."""
    g = torch.Generator().manual_seed(seed)
    mel = estimator.cfg.out_channels
    x = torch.randn(batch, mel, frames, generator=g)
    mu = torch.randn(batch, mel, frames, generator=g)
    spks = torch.randn(batch, mel, generator=g)
    cond = torch.zeros(batch, mel, frames)
    cond[:, :, : frames // 4] = torch.randn(batch, mel, frames // 4, generator=g)
    half = batch // 2
    mu[half:], spks[half:], cond[half:] = 0, 0, 0
    t = torch.full((batch,), 0.3)
    lengths = torch.tensor([frames - (i % 3) * (frames // 5) for i in range(batch)], dtype=torch.int32)
    chunks = torch.tensor(
        [estimator.cfg.static_chunk_size if i % 2 == 0 else 0 for i in range(batch)], dtype=torch.int32
    )
    return (
        x.to(device),
        mu.to(device),
        t.to(device),
        spks.to(device),
        cond.to(device),
        lengths.to(device),
        chunks.to(device),
    )


def export_onnx(estimator: CausalConditionalDecoder, path: str | Path, opset: int = ONNX_OPSET) -> Path:
    """Write the estimator's masked call to ``path`` as ONNX with dynamic batch and length (float32)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    device = next(estimator.parameters()).device
    module = MaskedEstimator(estimator).eval()
    args = example_inputs(estimator, batch=2, frames=120, device=device)
    dynamic = {name: {0: "batch"} for name in INPUT_NAMES}
    for name in ("x", "mu", "cond"):
        dynamic[name] = {0: "batch", 2: "frames"}
    dynamic[OUTPUT_NAME] = {0: "batch", 2: "frames"}
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter: it needs no onnxscript, and the graph has no control flow.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes=dynamic,
            do_constant_folding=True,
        )
    return path


# -- availability, cache keys -----------------------------------------------------------------------


def unavailable_reason(device: torch.device) -> str | None:
    """Why TensorRT cannot run here (None when it can)."""
    if device.type != "cuda":
        return f"the model runs on {device.type}, not CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import tensorrt  # noqa: F401
    except ImportError as error:
        return f"tensorrt is not installed (pip install 'rtvoice[trt]'): {error}"
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def weights_fingerprint(estimator: nn.Module) -> str:
    """A short hash of the estimator's weights: an engine is only valid for the weights it was built from."""
    h = hashlib.sha256()
    for name, tensor in sorted(estimator.state_dict().items()):
        h.update(name.encode())
        flat = tensor.detach().float().flatten()
        h.update(str(tuple(tensor.shape)).encode())
        h.update(flat[:: max(1, flat.numel() // 4096)].cpu().numpy().tobytes())  # a sample: fast on 0.5B models
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Profile:
    """The shapes an engine accepts: batch rows (CFG doubles a call's streams) and frames."""

    max_batch: int
    max_frames: int = MAX_FRAMES
    min_frames: int = MIN_FRAMES
    opt_frames: int = OPT_FRAMES

    @property
    def opt_batch(self) -> int:
        return min(self.max_batch, 8)

    def covers(self, rows: int, frames: int) -> bool:
        """Whether an estimator call of ``rows`` rows (twice the streams) and ``frames`` frames fits."""
        return 2 <= rows <= 2 * self.max_batch and self.min_frames <= frames <= self.max_frames

    @property
    def tag(self) -> str:
        return f"b{self.max_batch}-t{self.max_frames}"


def cache_dir(model_dir: Path, data_dir: Path | None) -> Path:
    """``<model dir>/trt`` when it can be written, else ``<data dir>/trt/<model dir hash>``."""
    preferred = Path(model_dir) / "trt"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            probe = preferred / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
            return preferred
    except OSError:
        pass
    base = Path(data_dir) if data_dir is not None else Path(tempfile.gettempdir()) / "rtvoice"
    digest = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:12]
    fallback = base / "trt" / digest
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def engine_file(directory: Path, gpu: str, trt_version: str, precision: str, profile: Profile, weights: str) -> Path:
    return directory / f"estimator.{_slug(gpu)}.trt{_slug(trt_version)}.{precision}.{profile.tag}.{weights}.plan"


# -- building -------------------------------------------------------------------------------------


def build_engine(onnx_path: Path, precision: str, profile: Profile, optimization_level: int | None = None) -> bytes:
    """Serialized TensorRT engine for the exported estimator (``precision``: 'fp16' or 'fp32')."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt, "NetworkDefinitionCreationFlag") and hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)  # required before TensorRT 10
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision != "fp32":
        raise ValueError(f"unknown precision {precision!r}")
    if optimization_level is not None:
        config.builder_optimization_level = optimization_level
    shapes = builder.create_optimization_profile()
    mel = network.get_input(0).shape[1]
    dims: list[tuple[int, ...]]  # each input's min, opt and max shape
    for name in INPUT_NAMES:
        if name in ("x", "mu", "cond"):
            dims = [
                (b, mel, t)
                for b, t in (
                    (2, profile.min_frames),
                    (2 * profile.opt_batch, profile.opt_frames),
                    (2 * profile.max_batch, profile.max_frames),
                )
            ]
        elif name == "spks":
            dims = [(2, mel), (2 * profile.opt_batch, mel), (2 * profile.max_batch, mel)]
        else:
            dims = [(2,), (2 * profile.opt_batch,), (2 * profile.max_batch,)]
        shapes.set_shape(name, *dims)
    config.add_optimization_profile(shapes)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT could not build a {precision} engine from {onnx_path}")
    return bytes(serialized)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def load_or_build(
    estimator: CausalConditionalDecoder,
    directory: Path,
    precision: str,
    profile: Profile,
    device: torch.device,
    optimization_level: int | None = None,
) -> tuple[bytes, Path, bool]:
    """The engine for this GPU, TensorRT and precision: from the cache, or exported and built (and cached).
    Returns (engine bytes, its path, whether it was built now)."""
    import tensorrt as trt

    gpu = torch.cuda.get_device_name(device)
    path = engine_file(directory, gpu, trt.__version__, precision, profile, weights_fingerprint(estimator))
    if path.is_file():
        return path.read_bytes(), path, False
    onnx_path = directory / f"estimator.opset{ONNX_OPSET}.{weights_fingerprint(estimator)}.onnx"
    if not onnx_path.is_file():
        log.info("exporting the flow estimator to %s", onnx_path)
        tmp = onnx_path.with_name(f".{onnx_path.name}.{os.getpid()}.tmp.onnx")
        export_onnx(estimator, tmp)
        os.replace(tmp, onnx_path)
    log.info("building a TensorRT %s engine for %s (%s); this takes a few minutes once", precision, gpu, profile.tag)
    data = build_engine(onnx_path, precision, profile, optimization_level)
    _write_atomically(path, data)
    return data, path, True


# -- running --------------------------------------------------------------------------------------


class TrtEstimator:
    """A TensorRT engine behind the :class:`~engine.models.cosyvoice2.estimator.Estimator` call, with a
    pool of execution contexts; shapes outside its profile run on ``fallback`` (torch)."""

    def __init__(
        self, engine_bytes: bytes, precision: str, profile: Profile, device: torch.device, contexts: int, fallback: Any
    ) -> None:
        import tensorrt as trt

        self.precision = precision
        self.profile = profile
        self.device = device
        self.fallback = fallback
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise RuntimeError("TensorRT could not load the engine (built by another TensorRT or GPU?)")
        self._pool: queue.Queue[tuple[Any, torch.cuda.Event | None]] = queue.Queue()
        for _ in range(max(1, contexts)):
            context = self.engine.create_execution_context()
            if context is None:
                raise RuntimeError("TensorRT could not create an execution context (out of GPU memory?)")
            self._pool.put((context, None))

    def __call__(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        lengths: torch.Tensor,
        chunks: torch.Tensor,
    ) -> torch.Tensor:
        if not self.profile.covers(x.shape[0], x.shape[2]):
            return self.fallback(x, mu, t, spks, cond, lengths, chunks)
        inputs = {
            "x": x.float().contiguous(),
            "mu": mu.float().contiguous(),
            "t": t.float().contiguous(),
            "spks": spks.float().contiguous(),
            "cond": cond.float().contiguous(),
            "lengths": lengths.to(torch.int32).contiguous(),
            "chunks": chunks.to(torch.int32).contiguous(),
        }
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        stream = torch.cuda.current_stream(x.device)
        context, last = self._pool.get()
        try:
            if last is not None:
                stream.wait_event(last)  # the context's previous run (maybe on another stream) is done first
            for name, tensor in inputs.items():
                context.set_input_shape(name, tuple(tensor.shape))
                context.set_tensor_address(name, tensor.data_ptr())
            context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError("TensorRT estimator run failed")
            done = torch.cuda.Event()
            done.record(stream)
            # The inputs must outlive the run: record them on the stream for the caching allocator.
            for tensor in inputs.values():
                tensor.record_stream(stream)
            last = done
        finally:
            self._pool.put((context, last))
        return out.to(x.dtype)


def snr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (inf when equal; NaN if test is not finite)."""
    reference, test = reference.double(), test.double()
    if not torch.isfinite(test).all():
        return float("nan")
    noise = (test - reference).pow(2).sum()
    if noise == 0:
        return float("inf")
    return float(10 * torch.log10(reference.pow(2).sum() / noise))


@dataclass
class Setup:
    backend: str
    """What runs the estimator: 'torch', 'trt-fp16' or 'trt-fp32'."""
    reason: str = ""
    snr_fp16_db: float | None = None
    engine_path: Path | None = None
    built: bool = False


_LOGGED: set[str] = set()
_LOG_LOCK = threading.Lock()


def _log_once(level: int, message: str, *args: Any) -> None:
    key = message % args
    with _LOG_LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    log.log(level, message, *args)


def _validate(engine: TrtEstimator, estimator: CausalConditionalDecoder, device: torch.device) -> float:
    """SNR (dB) of the engine against torch fp32 on example inputs; NaN when its output is not finite."""
    args = example_inputs(estimator, batch=2, frames=240, device=device, seed=1)  # covered by any profile
    with torch.inference_mode():
        want = estimator.forward_masked(*args[:5], args[5].long(), args[6].long())
        got = engine(*args)
    return snr_db(want, got)


def setup_estimator(
    flow: Any,
    backend: str,
    *,
    device: torch.device,
    model_dir: Path,
    data_dir: Path | None,
    contexts: int,
    max_batch: int,
    optimization_level: int | None = None,
) -> Setup:
    """Attach a TensorRT estimator to ``flow.decoder`` as ``backend`` asks ('torch', 'trt-fp16', 'trt-fp32',
    'auto'), or leave torch in place (logged once) when TensorRT or CUDA is missing or the build fails."""
    if backend not in BACKENDS:
        raise ValueError(f"estimator backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    cfm = flow.decoder
    cfm.accelerated = None
    if backend == "torch":
        return Setup("torch", "asked for torch")
    reason = unavailable_reason(device)
    if reason is not None:
        level = logging.INFO if backend == "auto" else logging.WARNING
        _log_once(level, "CosyVoice2 flow estimator on torch: %s", reason)
        return Setup("torch", reason)
    estimator = cfm.estimator
    profile = Profile(max_batch=max(1, max_batch))
    directory = cache_dir(model_dir, data_dir)
    fallback = estimator.forward_masked
    precisions = ["fp32"] if backend == "trt-fp32" else ["fp16", "fp32"]
    snr = None
    for precision in precisions:
        try:
            data, path, built = load_or_build(estimator, directory, precision, profile, device, optimization_level)
            engine = TrtEstimator(data, precision, profile, device, contexts, fallback)
        except Exception as error:  # a failed build must not take the model down: torch still works
            _log_once(logging.WARNING, "TensorRT %s estimator unavailable (%s); using torch", precision, error)
            return Setup("torch", f"TensorRT {precision} failed: {error}")
        quality = _validate(engine, estimator, device)
        if precision == "fp16":
            snr = quality
            if quality != quality or quality < FP16_MIN_SNR_DB:  # NaN: non-finite output
                _log_once(
                    logging.WARNING,
                    "TensorRT fp16 estimator output is %s against torch fp32; using fp32",
                    "not finite" if quality != quality else f"only {quality:.1f} dB",
                )
                continue
        cfm.accelerated = engine
        cfm.fp32_fallback = None if precision == "fp32" else fallback
        log.info(
            "CosyVoice2 flow estimator on TensorRT %s (%s)%s",
            precision,
            path.name,
            f", {quality:.1f} dB SNR against torch fp32" if precision == "fp16" else "",
        )
        return Setup(f"trt-{precision}", "", snr, path, built)
    return Setup("torch", "no usable TensorRT engine", snr)
