"""Reading a CosyVoice2 model directory's checkpoints into our modules.

Sizes the reference classes hard-code (kernel sizes, the number of up-sampled encoder blocks, the
look-ahead conv width, the F0 predictor depth) are read from the checkpoint's tensor shapes, the rest
from the yaml. Every key is checked before loading, so a wrong or partial file fails with the file,
the key and the shapes involved instead of a bare ``load_state_dict`` error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file as load_safetensors
from torch import nn
from transformers import Qwen2Config

from .config import CosyVoice2Config
from .flow import CausalMaskedDiffWithXvec
from .hift import HiFTGenerator
from .llm import Qwen2LM

StateDict = dict[str, torch.Tensor]

QWEN_DIR = "CosyVoice-BlankEN"
_QWEN_PREFIX = "llm.model.model."
_QWEN_LM_HEAD = "llm.model.lm_head.weight"  # the text LM head; CosyVoice scores speech tokens with llm_decoder
_HIFT_PREFIX = "generator."  # HiFT saved inside a HiFiGAN training wrapper
_WN_PAIRS = (
    (".weight_g", ".weight_v"),  # torch.nn.utils.weight_norm (older checkpoints)
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),  # parametrizations API
)


class CheckpointError(RuntimeError):
    """A model file is missing, unreadable, or does not fit the architecture the yaml describes."""


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise CheckpointError(f"missing model file: {path}")
    return path


def read_state_dict(path: Path) -> StateDict:
    require_file(path)
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # re-raised with the file named
        raise CheckpointError(f"{path}: cannot read state dict: {e}") from e
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: expected a state dict, got {type(sd).__name__}")
    return sd


def _key(sd: StateDict, key: str, path: Path) -> torch.Tensor:
    if key not in sd:
        raise CheckpointError(f"{path}: missing key '{key}'")
    return sd[key]


def _count_indexed(sd: StateDict, prefix: str, path: Path) -> int:
    """Number of ``prefix{i}.`` groups (highest index + 1), e.g. 4 for encoder.up_encoders.0. to .3."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(m.group(1)) for k in sd if (m := pattern.match(k))}
    if not indices:
        raise CheckpointError(f"{path}: no keys under '{prefix}N.'")
    return max(indices) + 1


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Weight-norm parameters to a plain weight: g * v / ||v||, the norm over every dim but 0.

    Computed by the op that both of torch's weight-norm APIs run on every forward pass (the reference keeps
    its layers parametrized), so the folded weight has the reference's bits: HiFT's sine source integrates
    the predicted f0 over the utterance, and a one-ulp change in one f0 value already moves the source by
    ~1e-4 (``PARITY.md``).
    """
    return torch._weight_norm(v, g, 0)


def normalize_hift_state_dict(sd: StateDict, path: Path) -> StateDict:
    """Strip a ``generator.`` prefix and fold either weight-norm layout into ``*.weight``."""
    if all(k.startswith(_HIFT_PREFIX) for k in sd):
        sd = {k[len(_HIFT_PREFIX) :]: v for k, v in sd.items()}
    out: StateDict = {}
    for key, value in sd.items():
        for g_suffix, v_suffix in _WN_PAIRS:
            if key.endswith(g_suffix):
                base = key[: -len(g_suffix)]
                out[base + ".weight"] = fold_weight_norm(value, _key(sd, base + v_suffix, path))
                break
            if key.endswith(v_suffix):
                _key(sd, key[: -len(v_suffix)] + g_suffix, path)  # its pair must exist; folded there
                break
        else:
            out[key] = value
    return out


def load_checked(module: nn.Module, sd: StateDict, path: Path, ignore: Iterable[str] = ()) -> None:
    """Load ``sd`` into ``module`` after checking keys and shapes, with a readable error."""
    expected = {k: v.shape for k, v in module.state_dict().items()}
    skip = set(ignore)
    problems = []
    missing = sorted(k for k in expected if k not in sd)
    if missing:
        problems.append("missing keys: " + ", ".join(f"'{k}' {tuple(expected[k])}" for k in missing[:10]))
        if len(missing) > 10:
            problems[-1] += f" ... ({len(missing)} in all)"
    unexpected = sorted(k for k in sd if k not in expected and k not in skip)
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(f"'{k}'" for k in unexpected[:10]))
    mismatched = [
        f"'{k}' is {tuple(sd[k].shape)} in the file, the model expects {tuple(shape)}"
        for k, shape in expected.items()
        if k in sd and tuple(sd[k].shape) != tuple(shape)
    ]
    if mismatched:
        problems.append("shape mismatch: " + "; ".join(mismatched[:10]))
    if problems:
        raise CheckpointError(f"{path}: " + " | ".join(problems))
    module.load_state_dict({k: sd[k].float() for k in expected}, strict=True)


def build_hift(cfg: CosyVoice2Config, path: Path) -> HiFTGenerator:
    sd = normalize_hift_state_dict(read_state_dict(path), path)
    hift = HiFTGenerator(
        cfg.hift,
        f0_num_convs=_count_indexed(sd, "f0_predictor.condnet.", path) // 2 + 1,  # conv, ELU, conv, ...
        f0_kernel_size=_key(sd, "f0_predictor.condnet.0.weight", path).shape[-1],
        pre_kernel=_key(sd, "conv_pre.weight", path).shape[-1],
        post_kernel=_key(sd, "conv_post.weight", path).shape[-1],
    )
    load_checked(hift, sd, path)
    return hift


def build_flow(cfg: CosyVoice2Config, path: Path) -> CausalMaskedDiffWithXvec:
    sd = read_state_dict(path)
    flow = CausalMaskedDiffWithXvec(
        cfg.flow,
        lookahead_hidden=_key(sd, "encoder.pre_lookahead_layer.conv1.weight", path).shape[0],
        num_up_blocks=_count_indexed(sd, "encoder.up_encoders.", path),
    )
    load_checked(flow, sd, path)
    return flow


def build_llm(cfg: CosyVoice2Config, path: Path, qwen_dir: Path) -> Qwen2LM:
    """The LM from ``llm.pt``; its Qwen2 backbone shaped by ``qwen_dir/config.json``.

    ``llm.pt`` normally carries the backbone weights too (they were fine-tuned); only when it has
    none are they taken from ``qwen_dir/model.safetensors``.
    """
    sd = read_state_dict(path)
    backbone_config = Qwen2Config.from_json_file(str(require_file(qwen_dir / "config.json")))
    lm = Qwen2LM(cfg.llm, backbone_config)
    mapped: StateDict = {}
    for key, value in sd.items():
        if key.startswith(_QWEN_PREFIX):
            mapped["backbone." + key[len(_QWEN_PREFIX) :]] = value
        elif key != _QWEN_LM_HEAD:
            mapped[key] = value
    if not any(k.startswith("backbone.") for k in mapped):
        weights_path = require_file(qwen_dir / "model.safetensors")
        for key, value in load_safetensors(str(weights_path)).items():
            if key.startswith("model."):
                mapped["backbone." + key[len("model.") :]] = value
    load_checked(lm, mapped, path)
    return lm
