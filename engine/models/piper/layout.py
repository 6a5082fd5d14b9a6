"""Run a stage's 1-D convolutions as 2-D ones, over a height of one.

onnxruntime runs 4-D convolutions with its blocked (NCHWc) kernels on x86, but 3-D (1-D) ones through
im2col and a matrix product: on the 2-core test machines a Piper decoder chunk takes about 20% less time
as 2-D, with the same output to float rounding (``bench/decoder_layout.py``). The rewrite is exact
arithmetic, so whether to use it is a question of speed on the machine at hand, which the voice
measures when it loads (``PiperVoice``).

Tensors that flow from the stage's first input through convolutions and elementwise ops get a unit
axis at position 2. Any other op that reads one gets it back without that axis, and so do the stage's
outputs, so the stage keeps its interface.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rtvoice.engine.models.piper.graph import Stage

CONVOLUTIONS = {"Conv", "ConvTranspose"}
UNARY = {"LeakyRelu", "Relu", "Tanh", "Sigmoid", "Identity", "Neg", "Exp"}
BINARY = {"Add", "Sub", "Mul", "Div"}
UNIT_AXIS = 2
"""Where the height of one goes: [batch, channels, 1, frames]."""


def two_dimensional(stage: Stage) -> Stage | None:
    """``stage`` with the convolutions on its first input's path run as 2-D ones; None when nothing could be
    rewritten (no convolution there, a weight that is not a constant, or a tensor of unknown rank)."""
    model = onnx.load_from_string(stage.model)
    graph = model.graph
    ranks = _ranks(model, stage.inputs[0])
    initializers = {t.name: t for t in graph.initializer}
    new_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0) >= 13
    wide: dict[str, str] = {stage.inputs[0]: f"{stage.inputs[0]}__2d"}
    """3-D tensor -> its 4-D form."""
    narrow: dict[str, str] = {}
    """4-D tensor -> its 3-D form made for an op that is not rewritten."""
    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    rewritten = 0

    def axes_node(op: str, source: str, target: str) -> onnx.NodeProto:
        if new_opset:
            axes = f"{target}__axes"
            added.append(numpy_helper.from_array(_axes(), axes))
            return helper.make_node(op, [source, axes], [target])
        return helper.make_node(op, [source], [target], axes=[UNIT_AXIS])

    def as_3d(tensor: str) -> str:
        if tensor not in narrow:
            narrow[tensor] = f"{tensor}__1d"
            nodes.append(axes_node("Squeeze", tensor, narrow[tensor]))
        return narrow[tensor]

    first_input = stage.inputs[0]
    nodes.append(axes_node("Unsqueeze", first_input, wide[first_input]))
    for node in graph.node:
        reads_wide = any(t in wide for t in node.input)
        if not reads_wide:
            nodes.append(node)
            continue
        if node.op_type in CONVOLUTIONS and node.input[0] in wide and len(node.input) > 1 \
                and node.input[1] in initializers and all(t not in wide for t in node.input[1:]):
            weight = numpy_helper.to_array(initializers[node.input[1]])
            if weight.ndim != 3:
                return None
            weight_name = f"{node.input[1]}__2d"
            added.append(numpy_helper.from_array(weight[:, :, None, :], weight_name))
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            nodes.append(helper.make_node(node.op_type, [wide[node.input[0]], weight_name, *node.input[2:]],
                                          [_wide_output(node, wide)], name=node.name, **_two_d(attributes)))
            rewritten += 1
        elif node.op_type in UNARY and len(node.input) == 1:
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            nodes.append(helper.make_node(node.op_type, [wide[node.input[0]]], [_wide_output(node, wide)],
                                          name=node.name, **attributes))
        elif node.op_type in BINARY:
            inputs = []
            for tensor in node.input:
                if tensor in wide:
                    inputs.append(wide[tensor])
                    continue
                rank = ranks.get(tensor)
                if rank is None:
                    return None
                if rank < 3:  # a scalar or a per-frame constant broadcasts the same in 4-D
                    inputs.append(tensor)
                    continue
                raised = f"{tensor}__2d"
                nodes.append(axes_node("Unsqueeze", tensor, raised))
                inputs.append(raised)
            nodes.append(helper.make_node(node.op_type, inputs, [_wide_output(node, wide)], name=node.name))
        else:
            node.input[:] = [as_3d(wide[t]) if t in wide else t for t in node.input]
            nodes.append(node)
    if rewritten == 0:
        return None
    for output in graph.output:
        if output.name in wide:
            nodes.append(axes_node("Squeeze", wide[output.name], output.name))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {t for node in nodes for t in node.input}
    kept = [t for t in [*graph.initializer, *added] if t.name in used]  # the 3-D weights are gone
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return Stage(model=model.SerializeToString(), inputs=stage.inputs, outputs=stage.outputs)


def input_channels(stage: Stage) -> int | None:
    """Channels of ``stage``'s first input, [batch, channels, frames], as the first convolution reading it
    expects them; None when no convolution reads it directly."""
    model = onnx.load_from_string(stage.model)
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[0] == stage.inputs[0] and node.input[1] in initializers:
            weight = initializers[node.input[1]]
            groups = next((a.i for a in node.attribute if a.name == "group"), 1)
            return int(weight.dims[1]) * groups
    return None


def _wide_output(node: onnx.NodeProto, wide: dict[str, str]) -> str:
    (output,) = node.output
    wide[output] = f"{output}__2d"
    return wide[output]


def _two_d(attributes: dict[str, object]) -> dict[str, object]:
    """A 1-D convolution's attributes for the same convolution over [1, frames]."""
    converted = dict(attributes)
    for name in ("kernel_shape", "dilations", "strides", "output_padding", "output_shape"):
        if name in attributes:
            converted[name] = [1 if name != "output_padding" else 0, *attributes[name]]  # type: ignore[misc]
    if "pads" in attributes:
        begin, end = attributes["pads"]  # type: ignore[misc]
        converted["pads"] = [0, begin, 0, end]
    return converted


def _axes() -> np.ndarray:
    return np.array([UNIT_AXIS], dtype=np.int64)


def _ranks(model: onnx.ModelProto, first_input: str) -> dict[str, int]:
    """Each tensor's rank where shape inference knows it, given that ``first_input`` is [batch, channels, frames]."""
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for value in typed.graph.input:
        if value.name == first_input:
            value.type.tensor_type.shape.Clear()
            for axis in ("batch", "channels", "frames"):
                value.type.tensor_type.shape.dim.add().dim_param = axis
    inferred = onnx.shape_inference.infer_shapes(typed).graph
    ranks: dict[str, int] = {}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        if value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    for tensor in model.graph.initializer:
        ranks[tensor.name] = len(tensor.dims)
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                ranks[node.output[0]] = len(value.dims)
    return ranks
