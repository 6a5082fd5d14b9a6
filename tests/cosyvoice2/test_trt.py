"""The estimator's ONNX export (checked with onnxruntime on the CPU) and the TensorRT paths, which skip
without CUDA and TensorRT; the torch fallback and the engine cache's location are checked everywhere."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2 import trt  # noqa: E402

TOL = 1e-4


def _needs_trt() -> None:
    reason = trt.unavailable_reason(torch.device("cuda"))
    if reason is not None:
        pytest.skip(f"TensorRT path needs CUDA and TensorRT: {reason}")


def test_onnx_export_matches_torch(model: Any, tmp_path: Path) -> None:
    """opset 18, dynamic batch and length: onnxruntime on the export equals the torch estimator."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    estimator = model.flow.decoder.estimator
    path = trt.export_onnx(estimator, tmp_path / "estimator.onnx")
    graph = onnx.load(str(path))
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) == trt.ONNX_OPSET
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(trt.INPUT_NAMES)
    for batch, frames in ((2, 120), (6, 333), (2, 17)):  # other shapes than the export's example
        args = trt.example_inputs(estimator, batch=batch, frames=frames, seed=batch)
        with torch.inference_mode():
            want = estimator.forward_masked(*args[:5], args[5].long(), args[6].long())
        (got,) = session.run(None, {name: a.numpy() for name, a in zip(trt.INPUT_NAMES, args, strict=True)})
        assert got.shape == tuple(want.shape)
        assert float(np.abs(got - want.numpy()).max()) < TOL


def test_masked_call_equals_the_flows_own_call(model: Any) -> None:
    """What the engine replaces (the masked call) equals the estimator's own streaming and full calls."""
    estimator = model.flow.decoder.estimator
    x, mu, t, spks, cond, _, _ = trt.example_inputs(estimator, batch=2, frames=150)
    with torch.inference_mode():
        for streaming in (True, False):
            want = estimator(x, mu, t, spks, cond, streaming)
            chunk = estimator.cfg.static_chunk_size if streaming else 0
            got = estimator.forward_masked(x, mu, t, spks, cond, torch.tensor([150, 150]), torch.tensor([chunk] * 2))
            assert float((got - want).abs().max()) < TOL


def test_torch_fallback_without_cuda(model: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the fallback is for machines without")
    for backend in ("auto", "trt-fp16", "trt-fp32"):
        setup = trt.setup_estimator(
            model.flow,
            backend,
            device=torch.device("cpu"),
            model_dir=tmp_path,
            data_dir=tmp_path,
            contexts=2,
            max_batch=4,
        )
        assert setup.backend == "torch" and "not CUDA" in setup.reason
        assert model.flow.decoder.accelerated is None
    assert (
        trt.setup_estimator(
            model.flow, "torch", device=torch.device("cpu"), model_dir=tmp_path, data_dir=None, contexts=1, max_batch=1
        ).backend
        == "torch"
    )
    with pytest.raises(ValueError, match="backend"):
        trt.setup_estimator(
            model.flow,
            "tensorrt",
            device=torch.device("cpu"),
            model_dir=tmp_path,
            data_dir=None,
            contexts=1,
            max_batch=1,
        )


def test_engine_cache_beside_model_or_in_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert trt.cache_dir(model_dir, tmp_path / "data") == model_dir / "trt"
    read_only = tmp_path / "ro-model"
    read_only.mkdir()
    # A read-only model directory (root writes anywhere, so the check itself is what is simulated).
    access = os.access
    monkeypatch.setattr(
        trt.os, "access", lambda p, mode: False if str(p).startswith(str(read_only)) else access(p, mode)
    )
    where = trt.cache_dir(read_only, tmp_path / "data")
    assert where.parent == tmp_path / "data" / "trt" and where.is_dir()
    assert where == trt.cache_dir(read_only, tmp_path / "data")  # stable per model directory
    name = trt.engine_file(Path("/c"), "NVIDIA H200", "10.9.0.34", "fp16", trt.Profile(max_batch=8), "abc123").name
    assert name == "estimator.nvidia-h200.trt10.9.0.34.fp16.b8-t3000.abc123.plan"


def test_profile_covers_cfg_rows() -> None:
    profile = trt.Profile(max_batch=8)
    assert profile.covers(2, 100) and profile.covers(16, 3000)
    assert not profile.covers(18, 100) and not profile.covers(2, 3001) and not profile.covers(1, 100)


def test_snr() -> None:
    a = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert trt.snr_db(a, a) == float("inf")
    assert 19 < trt.snr_db(a, a + 0.1 * a) < 21
    assert trt.snr_db(a, a * float("nan")) != trt.snr_db(a, a * float("nan"))  # NaN


def test_trt_engine_matches_torch(model: Any, tmp_path: Path) -> None:
    """On a CUDA machine with TensorRT: fp32 and fp16 engines of the fixture's estimator against torch."""
    _needs_trt()
    import copy

    flow = copy.deepcopy(model.flow).cuda()
    estimator = flow.decoder.estimator
    args = trt.example_inputs(estimator, batch=4, frames=200, device="cuda")
    with torch.inference_mode():
        want = estimator.forward_masked(*args[:5], args[5].long(), args[6].long())
    for precision, min_snr in (("fp32", 60.0), ("fp16", trt.FP16_MIN_SNR_DB)):
        data, path, _ = trt.load_or_build(
            estimator, tmp_path, precision, trt.Profile(max_batch=4), torch.device("cuda")
        )
        assert path.is_file()
        engine = trt.TrtEstimator(
            data, precision, trt.Profile(max_batch=4), torch.device("cuda"), 2, estimator.forward_masked
        )
        got = engine(*args)
        assert trt.snr_db(want, got) > min_snr
    setup = trt.setup_estimator(
        flow, "auto", device=torch.device("cuda"), model_dir=tmp_path, data_dir=None, contexts=2, max_batch=4
    )
    assert setup.backend.startswith("trt-")
