"""A CosyVoice2 model directory for serving tests: the parity fixture plus stand-in front ends.

The fixture has no ``speech_tokenizer_v2.onnx`` and no ``campplus.onnx`` (weights we cannot
download here), so the zero-shot, cross-lingual, instruct2 and registration paths would not run.
The models built below STAND IN FOR THOSE WEIGHTS, NOT FOR THE CODE UNDER TEST: tiny ONNX graphs
with random weights and the released models' interfaces, so that our front end (Whisper log-mel,
Kaldi fbank, trimming, the ONNX calls, the mode wiring) really runs:

- speech tokenizer: ``feats`` float32 [1, 128, T] (Whisper log-mel at 100 frames/s) and
  ``feats_length`` int32 [1] -> ``indices`` int64 [1, ceil(T / 4)], ids in [0, 6561) (25 tokens/s);
- CAM++: ``input`` float32 [1, T, 80] (mean-normalised Kaldi fbank) -> ``output`` float32 [1, 192].

The other files of the fixture are symlinked, never copied. ``spk2info.pt`` is written with one
SFT speaker (an embedding only, like the SFT models') and one zero-shot speaker in the layout of
the reference's ``add_zero_shot_spk``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPEECH_TOKENS = 6561
EMBEDDING_DIM = 192


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="rtvoice-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def speech_tokenizer_standin(path: Path, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.standard_normal((1, 128)).astype(np.float32), "w")
    init = [
        weights,
        numpy_helper.from_array(np.array([0], dtype=np.int64), "start"),
        numpy_helper.from_array(np.array([2**62], dtype=np.int64), "end"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis"),
        numpy_helper.from_array(np.array([4], dtype=np.int64), "stride"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
        numpy_helper.from_array(np.array(1000.0, dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array(SPEECH_TOKENS, dtype=np.int64), "vocab"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "squeeze_axis"),
    ]
    nodes = [
        # every 4th frame (100 -> 25 per second), each projected to one number, hashed into the vocabulary
        helper.make_node("Slice", ["feats", "start", "end", "axis", "stride"], ["frames"]),
        helper.make_node("MatMul", ["w", "frames"], ["projected"]),  # [1, 1, T']
        helper.make_node("Cast", ["feats_length"], ["length_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["length_f", "zero"], ["no_length"]),  # consumes the length input
        helper.make_node("Add", ["projected", "no_length"], ["with_length"]),
        helper.make_node("Abs", ["with_length"], ["magnitude"]),
        helper.make_node("Mul", ["magnitude", "scale"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["as_int"], to=TensorProto.INT64),
        helper.make_node("Mod", ["as_int", "vocab"], ["ids"]),
        helper.make_node("Squeeze", ["ids", "squeeze_axis"], ["indices"]),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_standin",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "N"])],
        init,
    )
    _save(graph, path)


def campplus_standin(path: Path, seed: int = 2) -> None:
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array((rng.standard_normal((80, EMBEDDING_DIM)) * 0.1).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Abs", ["input"], ["magnitude"]),  # the input is mean-normalised: its mean is ~0
        helper.make_node("ReduceMean", ["magnitude"], ["pooled"], axes=[1], keepdims=0),  # [1, 80]
        helper.make_node("MatMul", ["pooled", "w"], ["output"]),  # [1, 192]
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, EMBEDDING_DIM])],
        init,
    )
    _save(graph, path)


def write_spk2info(path: Path, prompt_text_ids: list[int], seed: int = 3) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SPEECH_TOKENS, (1, 20), generator=g, dtype=torch.int32)
    torch.save(
        {
            "sft": {"embedding": torch.randn(1, EMBEDDING_DIM, generator=g)},
            "saved": {  # as the reference's add_zero_shot_spk stores a speaker
                "prompt_text": torch.tensor([prompt_text_ids], dtype=torch.int32),
                "prompt_text_len": torch.tensor([len(prompt_text_ids)], dtype=torch.int32),
                "llm_prompt_speech_token": tokens,
                "llm_prompt_speech_token_len": torch.tensor([20], dtype=torch.int32),
                "flow_prompt_speech_token": tokens,
                "flow_prompt_speech_token_len": torch.tensor([20], dtype=torch.int32),
                "prompt_speech_feat": torch.randn(1, 40, 80, generator=g) - 5,
                "prompt_speech_feat_len": torch.tensor([40], dtype=torch.int32),
                "llm_embedding": torch.randn(1, EMBEDDING_DIM, generator=g),
                "flow_embedding": torch.randn(1, EMBEDDING_DIM, generator=g),
            },
        },
        path,
    )


def serving_model_dir(fixture: Path, target: Path) -> Path:
    """``target``: the fixture's files symlinked, plus the stand-in ONNX front ends and a spk2info.pt."""
    target.mkdir(parents=True, exist_ok=True)
    for item in fixture.iterdir():
        if item.name in ("vectors.pt", "vectors.json", "README.md"):
            continue
        (target / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    speech_tokenizer_standin(target / "speech_tokenizer_v2.onnx")
    campplus_standin(target / "campplus.onnx")
    write_spk2info(target / "spk2info.pt", list(b"Saved prompt."))
    return target


def tone_wav(
    seconds: float = 2.0, rate: int = 24000, channels: int = 1, amplitude: float = 0.3, seed: int = 0
) -> bytes:
    """A WAV file (int16) of a voiced-sounding signal: a few harmonics of a wobbling pitch, some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 20 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    signal = sum(np.sin(k * phase) / k for k in range(1, 6)) + 0.05 * rng.standard_normal(len(t))
    signal = amplitude * signal / np.abs(signal).max()
    pcm = (np.clip(signal, -1, 1) * 32767).astype(np.int16)
    pcm = np.repeat(pcm[:, None], channels, axis=1).reshape(-1)
    data = pcm.tobytes()
    import struct

    header = (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * channels * 2, channels * 2, 16)
        + b"data"
        + struct.pack("<I", len(data))
    )
    return header + data
