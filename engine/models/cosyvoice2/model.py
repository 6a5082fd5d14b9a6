"""A loaded CosyVoice2 model directory: config, LM, flow, HiFT, prompt-mel extractor and, where the
directory has them, the ONNX front ends (speaker x-vector, speech tokenizer) and saved speakers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import CosyVoice2Config, load_config
from .flow import CausalMaskedDiffWithXvec
from .hift import HiFTGenerator
from .llm import Qwen2LM, llm_dtype
from .loader import QWEN_DIR, CheckpointError, build_flow, build_hift, build_llm
from .mel import MelExtractor
from .token2wav import Token2Wav

CONFIG_FILE = "cosyvoice2.yaml"
CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
SPK2INFO_FILE = "spk2info.pt"


def _onnx_session(path: Path) -> Any | None:
    if not path.is_file():
        return None
    import onnxruntime  # only needed when the directory ships the front ends

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@dataclass
class CosyVoice2Model:
    config: CosyVoice2Config
    llm: Qwen2LM
    flow: CausalMaskedDiffWithXvec
    hift: HiFTGenerator
    mel: MelExtractor
    token2wav: Token2Wav
    campplus: Any | None
    """onnxruntime session of the speaker-embedding model, if the directory has one."""
    speech_tokenizer: Any | None
    """onnxruntime session of the speech tokenizer, if the directory has one."""
    spk2info: dict[str, Any]
    """Saved speakers (prompt tokens, features, embeddings) keyed by id; empty if none."""

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @classmethod
    def load(
        cls, model_dir: str | Path, device: str | torch.device = "cpu", load_frontends: bool = True
    ) -> CosyVoice2Model:
        """Load every part on ``device``, in eval mode with gradients off: float32, but the LM in bf16 on CUDA."""
        root = Path(model_dir)
        if not root.is_dir():
            raise CheckpointError(f"model directory not found: {root}")
        config = load_config(root / CONFIG_FILE)
        llm = build_llm(config, root / "llm.pt", root / QWEN_DIR)
        flow = build_flow(config, root / "flow.pt")
        hift = build_hift(config, root / "hift.pt")
        for module in (flow, hift):
            module.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
        llm.to(device=device, dtype=llm_dtype(torch.device(device))).eval().requires_grad_(False)

        spk2info: dict[str, Any] = {}
        if (root / SPK2INFO_FILE).is_file():
            spk2info = torch.load(root / SPK2INFO_FILE, map_location=device, weights_only=True)
        return cls(
            config=config,
            llm=llm,
            flow=flow,
            hift=hift,
            mel=MelExtractor(config.mel),
            token2wav=Token2Wav(flow, hift, chunk_size=config.chunk_size),
            campplus=_onnx_session(root / CAMPPLUS_FILE) if load_frontends else None,
            speech_tokenizer=_onnx_session(root / SPEECH_TOKENIZER_FILE) if load_frontends else None,
            spk2info=spk2info,
        )
