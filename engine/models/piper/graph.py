"""Split a Piper (VITS) ONNX export into three streamable stages.

A Piper export is one graph: text encoder and duration predictor, then the
normalising flow, then the HiFi-GAN decoder. Run whole, nothing comes out until
the entire sentence is decoded. Split, the first stage runs once per segment and
the two convolutional stages run over frame chunks:

    encoder:  phoneme ids (+ duration noise)      -> frame-level prior (m, logs, mask)
    flow:     prior frames + prior noise          -> latent frames
    decoder:  latent frames                       -> waveform

The cut points come from the graph's structure, not from tensor names:

- the decoder input is the data input of the convolution that feeds the first
  ``ConvTranspose`` (HiFi-GAN's ``conv_pre``);
- the prior noise is the last ``RandomNormalLike`` that is an ancestor of the
  decoder input; every other ``RandomNormalLike`` is duration-predictor noise;
- the phoneme durations are the ``Ceil`` among the frame mask's ancestors (the
  rounded ``exp(logw) * mask * length_scale`` whose sum is the frame count):
  an extra encoder output, so each phoneme's frames are known (word timings).

Both kinds of noise become graph inputs, so a caller draws them from its own
seeded generator: runs are reproducible and batching cannot change them.
"""

from __future__ import annotations

import onnx
from onnx import helper

from rtvoice.engine.models.piper.stages import PiperGraphs, Stage

ELEMENTWISE_OPS = {"LeakyRelu", "Relu", "Add", "Mul", "Div", "Sub", "Identity"}


class GraphSplitError(ValueError):
    """The ONNX graph does not have the structure of a Piper/VITS export."""


def _decoder_input(nodes: list[onnx.NodeProto], producer: dict[str, int]) -> str:
    first_upsample = next((n for n in nodes if n.op_type == "ConvTranspose"), None)
    if first_upsample is None:
        raise GraphSplitError("no ConvTranspose node: not a HiFi-GAN decoder")
    tensor = first_upsample.input[0]
    while tensor in producer:
        node = nodes[producer[tensor]]
        if node.op_type == "Conv":
            return node.input[0]
        if node.op_type not in ELEMENTWISE_OPS:
            break
        # A multi-speaker decoder adds a 1x1 speaker projection to conv_pre's
        # output; follow the branch that comes from a wide convolution.
        candidates = [t for t in node.input if t in producer]
        tensor = max(candidates, key=lambda t: _conv_width(nodes[producer[t]]))
    raise GraphSplitError("could not find the decoder's first convolution")


def _conv_width(node: onnx.NodeProto) -> int:
    if node.op_type != "Conv":
        return 1  # an elementwise op still leads towards conv_pre
    for attr in node.attribute:
        if attr.name == "kernel_shape":
            return int(helper.get_attribute_value(attr)[0]) + 1
    return 1


def ancestors(targets: set[str], nodes: list[onnx.NodeProto], producer: dict[str, int]) -> set[int]:
    """Indices of the nodes that ``targets`` are computed from (``producer``: each tensor's node)."""
    seen: set[int] = set()
    stack = [producer[t] for t in targets if t in producer]
    while stack:
        index = stack.pop()
        if index in seen:
            continue
        seen.add(index)
        stack.extend(producer[t] for t in nodes[index].input if t in producer)
    return seen


def _descendants(source: int, nodes: list[onnx.NodeProto], consumers: dict[str, list[int]]) -> set[int]:
    seen: set[int] = set()
    stack = [source]
    while stack:
        index = stack.pop()
        if index in seen:
            continue
        seen.add(index)
        for tensor in nodes[index].output:
            stack.extend(consumers.get(tensor, []))
    return seen


def split(model: onnx.ModelProto) -> PiperGraphs:
    """Cut ``model`` into encoder, flow and decoder stages."""
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(model).graph
    elem_types = {
        v.name: v.type.tensor_type.elem_type
        for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)
    }
    nodes = list(graph.node)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, []).append(i)
    initializers = {t.name for t in graph.initializer}
    constants = {i for i, n in enumerate(nodes) if n.op_type == "Constant"}

    latent = _decoder_input(nodes, producer)
    to_latent = ancestors({latent}, nodes, producer)
    noise_nodes = [i for i, n in enumerate(nodes) if n.op_type == "RandomNormalLike"]
    prior_candidates = [i for i in noise_nodes if i in to_latent]
    if not prior_candidates:
        raise GraphSplitError("no RandomNormalLike feeds the decoder: not a VITS prior")
    prior_index = max(prior_candidates)
    duration_indices = [i for i in noise_nodes if i != prior_index]

    decoder_nodes = set().union(*(_descendants(c, nodes, consumers) for c in consumers[latent]))
    flow_nodes = (_descendants(prior_index, nodes, consumers) & to_latent) - {prior_index}
    encoder_nodes = set(range(len(nodes))) - decoder_nodes - flow_nodes - {prior_index}

    prior_noise = nodes[prior_index].output[0]
    duration_noise = [nodes[i].output[0] for i in duration_indices]
    graph_outputs = [o.name for o in graph.output]

    def external_inputs(members: set[int]) -> list[str]:
        produced = {t for i in members for t in nodes[i].output}
        needed: list[str] = []
        for i in sorted(members):
            for t in nodes[i].input:
                if t and t not in produced and t not in initializers and t not in needed:
                    if t in producer and producer[t] in constants:
                        continue
                    needed.append(t)
        return needed

    flow_inputs = external_inputs(flow_nodes)
    decoder_inputs = external_inputs(decoder_nodes)
    graph_input_names = [i.name for i in graph.input]
    encoder_outputs = [
        t
        for t in dict.fromkeys(flow_inputs + decoder_inputs)
        if t not in graph_input_names and t != prior_noise and t != latent
    ]

    # The frame mask is the flow input of shape [B, 1, T]: the one that every
    # coupling layer multiplies with. Pick the flow input with most consumers.
    frame_mask = max(
        (t for t in flow_inputs if t in encoder_outputs),
        key=lambda t: sum(1 for c in consumers.get(t, []) if c in flow_nodes),
    )

    durations = _durations(frame_mask, nodes, producer, encoder_nodes)
    encoder_outputs.append(durations)

    def build(name: str, members: set[int], inputs: list[str], outputs: list[str]) -> Stage:
        # Constants are cheap to duplicate, so each stage gets the ones it uses.
        used = {t for i in members for t in nodes[i].input}
        stage_nodes = [nodes[i] for i in sorted(members | {c for c in constants if nodes[c].output[0] in used})]
        if name == "encoder":
            stage_nodes = [n for n in stage_nodes if n.output[0] not in duration_noise]
        used_inits = [t for t in graph.initializer if t.name in used]
        g = helper.make_graph(
            stage_nodes,
            f"piper_{name}",
            [helper.make_tensor_value_info(t, elem_types.get(t, onnx.TensorProto.FLOAT), None) for t in inputs],
            [helper.make_tensor_value_info(t, elem_types.get(t, onnx.TensorProto.FLOAT), None) for t in outputs],
            initializer=used_inits,
        )
        stage = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
        return Stage(model=stage.SerializeToString(), inputs=inputs, outputs=outputs)

    encoder_inputs = [t for t in graph_input_names if any(t in nodes[i].input for i in encoder_nodes)]
    encoder = build("encoder", encoder_nodes, encoder_inputs + duration_noise, encoder_outputs)
    flow = build("flow", flow_nodes, flow_inputs, [latent])
    decoder = build("decoder", decoder_nodes, decoder_inputs, graph_outputs)
    return PiperGraphs(
        encoder=encoder,
        flow=flow,
        decoder=decoder,
        duration_noise=duration_noise,
        prior_noise=prior_noise,
        prior_mean=nodes[prior_index].input[0],
        latent=latent,
        frame_mask=frame_mask,
        durations=durations,
    )


def _durations(frame_mask: str, nodes: list[onnx.NodeProto], producer: dict[str, int], encoder_nodes: set[int]) -> str:
    """The rounded per-phoneme durations: the one ``Ceil`` the frame mask is computed from (VITS sums them into
    the frame count, ``y_lengths``, whose sequence mask is the frame mask)."""
    ceilings = [
        i for i in ancestors({frame_mask}, nodes, producer) if nodes[i].op_type == "Ceil" and i in encoder_nodes
    ]
    if len(ceilings) != 1:
        raise GraphSplitError(f"expected one Ceil (the phoneme durations) before the frame mask, found {len(ceilings)}")
    return nodes[ceilings[0]].output[0]


def context_frames(stage: Stage) -> int:
    """Frames of input context on each side that make a chunked run of ``stage`` equal a whole run.

    Walks the graph in order and keeps, for every tensor, how far (in input
    frames) its values reach and how many of its samples make one input frame.
    A convolution widens the reach by its one-sided padding; a transposed
    convolution multiplies the resolution. Parallel branches take the widest,
    so the result is an upper bound of the true receptive field.
    """
    model = onnx.load_from_string(stage.model)
    reach: dict[str, float] = {name: 0.0 for name in stage.inputs}
    scale: dict[str, float] = {name: 1.0 for name in stage.inputs}
    for node in model.graph.node:
        known = [t for t in node.input if t in reach]
        if not known:
            continue
        node_reach = max(reach[t] for t in known)
        node_scale = max(scale[t] for t in known)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            kernel = attrs.get("kernel_shape", [1])[0]
            dilation = attrs.get("dilations", [1])[0]
            node_reach += (kernel - 1) * dilation / 2 / node_scale
        elif node.op_type == "ConvTranspose":
            stride = attrs.get("strides", [1])[0]
            kernel = attrs.get("kernel_shape", [1])[0]
            node_reach += kernel / (2 * stride) / node_scale
            node_scale *= stride
        for out in node.output:
            reach[out] = node_reach
            scale[out] = node_scale
    return int(-(-max(reach[o] for o in stage.outputs) // 1))


def noise_channels(model: onnx.ModelProto, noise_output: str) -> int:
    """Channel count of a RandomNormalLike draw, found by running the graph up to it once."""
    import numpy as np
    import onnxruntime

    graph = model.graph
    nodes = list(graph.node)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    draw = nodes[producer[noise_output]]
    members = ancestors({draw.input[0]}, nodes, producer)
    used = {t for i in members for t in nodes[i].input}
    inputs = [i for i in graph.input if i.name in used]
    probe = helper.make_graph(
        [nodes[i] for i in sorted(members)],
        "probe",
        inputs,
        [helper.make_tensor_value_info(draw.input[0], onnx.TensorProto.FLOAT, None)],
        initializer=[t for t in graph.initializer if t.name in used],
    )
    session = onnxruntime.InferenceSession(
        helper.make_model(probe, opset_imports=model.opset_import, ir_version=model.ir_version).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    feeds = {
        "input": np.array([[1, 2, 3]], dtype=np.int64),
        "input_lengths": np.array([3], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        "sid": np.array([0], dtype=np.int64),
    }
    names = {i.name for i in session.get_inputs()}
    (value,) = session.run(None, {k: v for k, v in feeds.items() if k in names})
    return int(value.shape[1])
