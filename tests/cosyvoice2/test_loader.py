"""Loading the checkpoint layouts found in the wild, and the errors for broken directories.

HiFT checkpoints come in four layouts: weight norm as ``*.parametrizations.weight.original0/1`` (current torch) or
``*.weight_g/_v`` (older torch), each with or without a ``generator.`` prefix (HiFT saved inside its training
wrapper). Each test reads the layout of the checkpoint it is given and converts from that one, so every layout is
really loaded whatever the vector set (``RTVOICE_COSYVOICE2_FIXTURE``) carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cosyvoice2.deps import require

torch = require("torch")
require("transformers")

from rtvoice.engine.models.cosyvoice2 import CheckpointError, CosyVoice2Model  # noqa: E402

StateDict = dict[str, Any]

PREFIX = "generator."
WEIGHT_NORM_SUFFIXES = {
    "parametrizations": (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
    "weight_g_v": (".weight_g", ".weight_v"),
}


@dataclass(frozen=True)
class Layout:
    weight_norm: str
    """A key of WEIGHT_NORM_SUFFIXES."""
    prefixed: bool

    @property
    def g(self) -> str:
        return WEIGHT_NORM_SUFFIXES[self.weight_norm][0]

    @property
    def v(self) -> str:
        return WEIGHT_NORM_SUFFIXES[self.weight_norm][1]

    def key(self, name: str) -> str:
        return PREFIX + name if self.prefixed else name


ALL_LAYOUTS = [Layout(wn, prefixed) for wn in WEIGHT_NORM_SUFFIXES for prefixed in (False, True)]


def read_layout(sd: StateDict) -> Layout:
    """The layout of a HiFT state dict, from its keys."""
    found = {wn for wn, (g, v) in WEIGHT_NORM_SUFFIXES.items() if any(k.endswith(g) for k in sd)}
    assert len(found) == 1, f"expected one weight-norm layout in hift.pt, found {sorted(found) or 'none'}"
    return Layout(found.pop(), all(k.startswith(PREFIX) for k in sd))


def to_layout(sd: StateDict, target: Layout) -> StateDict:
    """``sd`` (in whichever layout it is) rewritten into ``target``."""
    source = read_layout(sd)
    out = {}
    for key, value in sd.items():
        name = key[len(PREFIX) :] if source.prefixed else key
        if name.endswith(source.g):
            name = name[: -len(source.g)] + target.g
        elif name.endswith(source.v):
            name = name[: -len(source.v)] + target.v
        out[target.key(name)] = value
    return out


def variant_dir(src: Path, dst: Path, replace: dict[str, StateDict]) -> Path:
    """A model directory in ``dst``: new files for ``replace``, symlinks to ``src`` for the rest."""
    dst.mkdir()
    for entry in src.iterdir():
        if entry.name in replace:
            torch.save(replace[entry.name], dst / entry.name)
        else:
            (dst / entry.name).symlink_to(entry)
    return dst


def hift_state_dict(model_dir: Path) -> StateDict:
    return torch.load(model_dir / "hift.pt", weights_only=True)


@pytest.mark.parametrize("target", ALL_LAYOUTS, ids=lambda t: f"{t.weight_norm}{'+generator' if t.prefixed else ''}")
def test_every_hift_layout_loads_identically(
    target: Layout, model: Any, model_dir: Path, vectors: dict[str, Any], tmp_path: Path
) -> None:
    sd = hift_state_dict(model_dir)
    converted = to_layout(sd, target)
    assert read_layout(converted) == target
    if target == read_layout(sd):
        assert converted.keys() == sd.keys()  # the checkpoint's own layout, unchanged
    variant = CosyVoice2Model.load(variant_dir(model_dir, tmp_path / "m", {"hift.pt": converted}))
    variant.hift.m_source.random_source = False

    want, got = model.hift.state_dict(), variant.hift.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    with torch.inference_mode():
        speech_a, source_a = model.hift(vectors["flow_offline_mel"])
        speech_b, source_b = variant.hift(vectors["flow_offline_mel"])
    assert torch.equal(speech_a, speech_b) and torch.equal(source_a, source_b)


def test_weight_norm_is_folded_as_torch_computes_it(model_dir: Path) -> None:
    """The folded weights equal torch's own weight-norm layers fed the checkpoint's g and v, bit for bit."""
    from rtvoice.engine.models.cosyvoice2.loader import fold_weight_norm

    sd = hift_state_dict(model_dir)
    layout = read_layout(sd)
    pairs = [(sd[k], sd[k[: -len(layout.g)] + layout.v]) for k in sd if k.endswith(layout.g)]
    assert pairs
    for g, v in pairs:
        layer = torch.nn.Conv1d(1, 1, 1)  # a stand-in owner for the parametrization; only its weight is used
        layer.weight = torch.nn.Parameter(v.clone())
        torch.nn.utils.parametrizations.weight_norm(layer)
        layer.parametrizations.weight.original0.data.copy_(g)
        layer.parametrizations.weight.original1.data.copy_(v)
        assert torch.equal(fold_weight_norm(g, v), layer.weight.detach())


def test_missing_file(model_dir: Path, tmp_path: Path) -> None:
    d = variant_dir(model_dir, tmp_path / "m", {})
    (d / "flow.pt").unlink()
    with pytest.raises(CheckpointError, match=r"missing model file: .*flow\.pt"):
        CosyVoice2Model.load(d)


def test_missing_model_dir(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="model directory not found"):
        CosyVoice2Model.load(tmp_path / "nowhere")


def test_missing_key(model_dir: Path, tmp_path: Path) -> None:
    sd = hift_state_dict(model_dir)
    layout = read_layout(sd)
    plain = sorted(k for k in sd if not k.endswith((layout.g, layout.v)))
    key = plain[-1]
    del sd[key]
    name = key[len(PREFIX) :] if layout.prefixed else key  # errors name keys as the model does
    d = variant_dir(model_dir, tmp_path / "m", {"hift.pt": sd})
    with pytest.raises(CheckpointError, match=rf"hift\.pt: missing keys: '{re.escape(name)}'"):
        CosyVoice2Model.load(d)


def test_missing_weight_norm_half(model_dir: Path, tmp_path: Path) -> None:
    sd = hift_state_dict(model_dir)
    layout = read_layout(sd)
    key = sorted(k for k in sd if k.endswith(layout.v))[0]
    del sd[key]
    name = key[len(PREFIX) :] if layout.prefixed else key
    d = variant_dir(model_dir, tmp_path / "m", {"hift.pt": sd})
    with pytest.raises(CheckpointError, match=rf"hift\.pt: missing key '{re.escape(name)}'"):
        CosyVoice2Model.load(d)


def test_shape_mismatch(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "flow.pt", weights_only=True)
    key = sorted(k for k, v in sd.items() if v.dim() == 1 and v.shape[0] > 1)[0]
    sd[key] = sd[key][:-1]
    d = variant_dir(model_dir, tmp_path / "m", {"flow.pt": sd})
    n = sd[key].shape[0]
    with pytest.raises(CheckpointError, match=rf"flow\.pt: shape mismatch: '{re.escape(key)}' is \({n},\)"):
        CosyVoice2Model.load(d)


def test_unexpected_key(model_dir: Path, tmp_path: Path) -> None:
    sd = torch.load(model_dir / "llm.pt", weights_only=True)
    sd["stray.weight"] = torch.zeros(1)
    d = variant_dir(model_dir, tmp_path / "m", {"llm.pt": sd})
    with pytest.raises(CheckpointError, match=r"llm\.pt: unexpected keys: 'stray\.weight'"):
        CosyVoice2Model.load(d)
