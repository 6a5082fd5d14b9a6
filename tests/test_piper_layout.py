"""A Piper decoder's 1-D convolutions run as 2-D ones: the same audio, from the real voice and from graphs with the
shapes other voices have (a speaker conditioning added to a convolution's output, other ops between convolutions)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from rtvoice.engine.models.piper import layout
from rtvoice.engine.models.piper.stages import Stage
from rtvoice.engine.models.piper.voice import PiperVoice


def session(stage: Stage) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(stage.model, providers=["CPUExecutionProvider"])


def conv_weight_ranks(stage: Stage) -> list[int]:
    model = onnx.load_from_string(stage.model)
    weights = {t.name: len(t.dims) for t in model.graph.initializer}
    return [weights[n.input[1]] for n in model.graph.node if n.op_type in layout.CONVOLUTIONS]


def test_the_voices_decoder_gives_the_same_audio_in_2d(piper_voice: PiperVoice) -> None:
    decoder = piper_voice.graphs.decoder
    rewritten = layout.two_dimensional(decoder)
    assert rewritten is not None and rewritten.inputs == decoder.inputs and rewritten.outputs == decoder.outputs
    assert set(conv_weight_ranks(rewritten)) == {4}  # every convolution of the decoder is 2-D now
    channels = layout.input_channels(decoder)
    frames = piper_voice.planner.chunk_size(piper_voice.geometry.max_chunk)
    latent = np.random.default_rng(3).standard_normal((2, channels, frames), dtype=np.float32)
    (expected,) = session(decoder).run(None, {piper_voice.graphs.latent: latent})
    (actual,) = session(rewritten).run(None, {piper_voice.graphs.latent: latent})
    assert actual.shape == expected.shape and np.abs(expected).max() > 0.01
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def conditioned_decoder(opset: int) -> Stage:
    """A small decoder shaped like a multi-speaker Piper one: conv_pre plus a 1x1 projection of a speaker embedding
    ([B, C, 1], an input of its own), an upsampling, a residual convolution, a scaled sum, a Transpose pair (other ops
    between convolutions), and the output unsqueezed as Piper's is."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)

    inputs = [
        helper.make_tensor_value_info("latent", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("speaker", TensorProto.FLOAT, None),
    ]
    nodes = [
        helper.make_node("Conv", ["latent", "pre_w", "pre_b"], ["pre"], kernel_shape=[7], pads=[3, 3]),
        helper.make_node("Conv", ["speaker", "cond_w"], ["cond"], kernel_shape=[1]),
        helper.make_node("Add", ["pre", "cond"], ["conditioned"]),
        helper.make_node("LeakyRelu", ["conditioned"], ["act"], alpha=0.1),
        helper.make_node("ConvTranspose", ["act", "up_w", "up_b"], ["up"], kernel_shape=[8], strides=[4], pads=[2, 2]),
        helper.make_node("Conv", ["up", "res_w", "res_b"], ["res"], kernel_shape=[3], dilations=[2], pads=[2, 2]),
        helper.make_node("Add", ["res", "up"], ["sum"]),
        helper.make_node("Div", ["sum", "two"], ["half"]),
        helper.make_node("Transpose", ["half"], ["swapped"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["swapped"], ["back"], perm=[0, 2, 1]),
        helper.make_node("Conv", ["back", "post_w"], ["post"], kernel_shape=[7], pads=[3, 3]),
        helper.make_node("Tanh", ["post"], ["wave"]),
    ]
    if opset >= 13:
        nodes.append(helper.make_node("Unsqueeze", ["wave", "axis_one"], ["output"]))
    else:
        nodes.append(helper.make_node("Unsqueeze", ["wave"], ["output"], axes=[1]))
    initializers = [
        weight("pre_w", 16, 8, 7),
        weight("pre_b", 16),
        weight("cond_w", 16, 4, 1),
        weight("up_w", 16, 8, 8),
        weight("up_b", 8),
        weight("res_w", 8, 8, 3),
        weight("res_b", 8),
        weight("post_w", 1, 8, 7),
        numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_one"),
    ]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "decoder", inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return Stage(model=model.SerializeToString(), inputs=["latent", "speaker"], outputs=["output"])


def test_a_conditioned_decoder_gives_the_same_audio_in_2d() -> None:
    for opset in (11, 15):  # Squeeze and Unsqueeze take their axes as an attribute before opset 13, as an input after
        decoder = conditioned_decoder(opset)
        rewritten = layout.two_dimensional(decoder)
        assert rewritten is not None
        assert conv_weight_ranks(rewritten) == [4] * 5  # the speaker projection's too
        assert conv_weight_ranks(decoder) == [3] * 5
        assert layout.input_channels(decoder) == 8
        rng = np.random.default_rng(opset)
        feeds = {
            "latent": rng.standard_normal((2, 8, 40), dtype=np.float32),
            "speaker": rng.standard_normal((2, 4, 1), dtype=np.float32),
        }
        (expected,) = session(decoder).run(None, feeds)
        (actual,) = session(rewritten).run(None, feeds)
        assert actual.shape == expected.shape == (2, 1, 1, 160)
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def test_a_stage_without_convolutions_on_its_input_is_left_as_it_is() -> None:
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    stage = Stage(model=helper.make_model(graph).SerializeToString(), inputs=["x"], outputs=["y"])
    assert layout.two_dimensional(stage) is None
    assert layout.input_channels(stage) is None
