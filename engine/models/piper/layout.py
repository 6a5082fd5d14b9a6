"""Run a stage's 1-D convolutions as 2-D ones, over a height of one.

onnxruntime runs 4-D convolutions with its blocked (NCHWc) kernels on x86, but 3-D (1-D) ones through
im2col and a matrix product: on the 2-core test machines a Piper decoder chunk takes about 20% less time
as 2-D, with the same output to float rounding (``bench/decoder_layout.py``). Piper's encoder and flow
gain nothing from it (their convolutions are small), so the voice rewrites its decoder only. The rewrite
is exact arithmetic, so whether to use it is a question of speed on the machine at hand, which the voice
measures when it loads (``PiperVoice``, with ``compare``, as the bench does at every chunk size).

Each convolution whose weight is a 3-D constant reads its input with a unit axis inserted at position 2
and its output loses that axis again, so every other op, and the stage's interface, stays as it was.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

from rtvoice.engine.models.piper.stages import Stage

CONVOLUTIONS = {"Conv", "ConvTranspose"}
UNIT_AXIS = 2
"""Where the height of one goes: [batch, channels, 1, frames]."""
AXES = "rtvoice_unit_axis"
"""The initializer that holds ``UNIT_AXIS`` for Squeeze and Unsqueeze (opset 13 on)."""


def two_dimensional(stage: Stage) -> Stage | None:
    """``stage`` with each 1-D convolution run as a 2-D one; None when it has none."""
    model = onnx.load_from_string(stage.model)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes: list[onnx.NodeProto] = []
    flat_weights = set()

    def axis_op(op: str, source: str, target: str) -> onnx.NodeProto:
        if opset >= 13:
            return helper.make_node(op, [source, AXES], [target])
        return helper.make_node(op, [source], [target], axes=[UNIT_AXIS])

    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type in CONVOLUTIONS and len(node.input) > 1 else None
        if weight is None or len(weight.dims) != 3:
            nodes.append(node)
            continue
        flat_weights.add(weight.name)
        raised_weight = f"{weight.name}__2d"
        if raised_weight not in weights:
            weights[raised_weight] = numpy_helper.from_array(
                numpy_helper.to_array(weight)[:, :, None, :], raised_weight
            )
        raised_input, raised_output = f"{node.output[0]}__2d_input", f"{node.output[0]}__2d"
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes.append(axis_op("Unsqueeze", node.input[0], raised_input))
        nodes.append(
            helper.make_node(
                node.op_type,
                [raised_input, raised_weight, *node.input[2:]],
                [raised_output],
                name=node.name,
                **_two_d(attributes),
            )
        )
        nodes.append(axis_op("Squeeze", raised_output, node.output[0]))
    if not flat_weights:
        return None
    del graph.node[:]
    graph.node.extend(nodes)
    used = {t for node in nodes for t in node.input}
    kept = [t for t in weights.values() if t.name in used]  # the 3-D weights are gone
    if opset >= 13:
        kept.append(numpy_helper.from_array(np.array([UNIT_AXIS], dtype=np.int64), AXES))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return Stage(model=model.SerializeToString(), inputs=stage.inputs, outputs=stage.outputs)


def input_channels(stage: Stage) -> int | None:
    """Channels of ``stage``'s first input, [batch, channels, frames], as the first convolution reading it
    expects them; None when no convolution reads it directly."""
    model = onnx.load_from_string(stage.model)
    weights = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[0] == stage.inputs[0] and node.input[1] in weights:
            groups = next((a.i for a in node.attribute if a.name == "group"), 1)
            return int(weights[node.input[1]].dims[1]) * groups
    return None


@dataclass(frozen=True)
class Comparison:
    """The two forms of a stage on the same input, on this machine."""

    exported_s: float
    """The fastest of the repeats as exported."""
    two_d_s: float
    """The same for the 2-D form."""
    difference: float
    """Largest absolute difference between their outputs (infinite when their shapes differ)."""


def compare(
    exported: onnxruntime.InferenceSession,
    two_d: onnxruntime.InferenceSession,
    feeds: dict[str, np.ndarray],
    repeats: int,
) -> Comparison:
    """Run both forms of a stage on ``feeds``, alternating so that a burst of other work slows both."""
    (expected,), (actual,) = exported.run(None, feeds), two_d.run(None, feeds)
    difference = float(np.abs(expected - actual).max()) if expected.shape == actual.shape else math.inf
    exported_s = two_d_s = math.inf
    for _ in range(repeats):
        exported_s = min(exported_s, _seconds(exported, feeds))
        two_d_s = min(two_d_s, _seconds(two_d, feeds))
    return Comparison(exported_s, two_d_s, difference)


def _seconds(session: onnxruntime.InferenceSession, feeds: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def _two_d(attributes: dict[str, Any]) -> dict[str, Any]:
    """A 1-D convolution's attributes for the same convolution over [1, frames]."""
    converted = dict(attributes)
    for name in ("kernel_shape", "dilations", "strides", "output_padding", "output_shape"):
        if name in attributes:
            height = 0 if name == "output_padding" else 1
            converted[name] = [height, *attributes[name]]
    if "pads" in attributes:
        begin, end = attributes["pads"]
        converted["pads"] = [0, begin, 0, end]
    return converted
