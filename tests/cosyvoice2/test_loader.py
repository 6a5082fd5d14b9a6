"""Loading the checkpoint layouts found in the wild, and the errors for broken directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rtvoice.engine.models.cosyvoice2 import CheckpointError, CosyVoice2Model  # noqa: E402

NEW_G, NEW_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"

StateDict = dict[str, Any]


def _variant_dir(src: Path, dst: Path, replace: dict[str, StateDict]) -> Path:
    """A model directory in ``dst``: new files for ``replace``, symlinks to ``src`` for the rest."""
    dst.mkdir()
    for entry in src.iterdir():
        if entry.name in replace:
            torch.save(replace[entry.name], dst / entry.name)
        else:
            (dst / entry.name).symlink_to(entry)
    return dst


def _old_weight_norm_names(sd: StateDict) -> StateDict:
    out = {}
    for k, v in sd.items():
        if k.endswith(NEW_G):
            out[k[: -len(NEW_G)] + ".weight_g"] = v
        elif k.endswith(NEW_V):
            out[k[: -len(NEW_V)] + ".weight_v"] = v
        else:
            out[k] = v
    return out


def _with_prefix(sd: StateDict) -> StateDict:
    return {"generator." + k: v for k, v in sd.items()}


@pytest.mark.parametrize(
    "convert",
    [_old_weight_norm_names, _with_prefix, lambda sd: _with_prefix(_old_weight_norm_names(sd))],
    ids=["weight_g_v", "generator_prefix", "both"],
)
def test_hift_key_variants_load_identically(
    convert: Callable[[StateDict], StateDict], model: Any, model_dir: Path, vectors: dict[str, Any], tmp_path: Path
) -> None:
    hift_sd = torch.load(model_dir / "hift.pt", weights_only=True)
    assert any(k.endswith(NEW_G) for k in hift_sd), "fixture expected in the parametrizations layout"
    variant = CosyVoice2Model.load(_variant_dir(model_dir, tmp_path / "m", {"hift.pt": convert(hift_sd)}))
    variant.hift.m_source.random_source = False

    want, got = model.hift.state_dict(), variant.hift.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    with torch.inference_mode():
        speech_a, source_a = model.hift(vectors["flow_offline_mel"])
        speech_b, source_b = variant.hift(vectors["flow_offline_mel"])
    assert torch.equal(speech_a, speech_b) and torch.equal(source_a, source_b)


def test_missing_file(model_dir: Path, tmp_path: Path) -> None:
    d = _variant_dir(model_dir, tmp_path / "m", {})
    (d / "flow.pt").unlink()
    with pytest.raises(CheckpointError, match=r"missing model file: .*flow\.pt"):
        CosyVoice2Model.load(d)


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="model directory not found"):
        CosyVoice2Model.load(tmp_path / "nowhere")


def test_missing_key(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "hift.pt", weights_only=True)
    del sd["conv_post.bias"]
    d = _variant_dir(model_dir, tmp_path / "m", {"hift.pt": sd})
    with pytest.raises(CheckpointError, match=r"hift\.pt: missing keys: 'conv_post\.bias'"):
        CosyVoice2Model.load(d)


def test_missing_weight_norm_half(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "hift.pt", weights_only=True)
    del sd["conv_pre" + NEW_V]
    d = _variant_dir(model_dir, tmp_path / "m", {"hift.pt": sd})
    with pytest.raises(CheckpointError, match=r"hift\.pt: missing key 'conv_pre\.parametrizations\.weight\.original1'"):
        CosyVoice2Model.load(d)


def test_shape_mismatch(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "flow.pt", weights_only=True)
    sd["encoder_proj.bias"] = sd["encoder_proj.bias"][:-1]
    d = _variant_dir(model_dir, tmp_path / "m", {"flow.pt": sd})
    n = sd["encoder_proj.bias"].shape[0]
    with pytest.raises(CheckpointError, match=rf"flow\.pt: shape mismatch: 'encoder_proj\.bias' is \({n},\)"):
        CosyVoice2Model.load(d)


def test_unexpected_key(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "llm.pt", weights_only=True)
    sd["stray.weight"] = torch.zeros(1)
    d = _variant_dir(model_dir, tmp_path / "m", {"llm.pt": sd})
    with pytest.raises(CheckpointError, match=r"llm\.pt: unexpected keys: 'stray\.weight'"):
        CosyVoice2Model.load(d)
