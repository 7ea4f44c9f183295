"""The ONNX file's rewrites for ONNX Runtime: concatenations padded with zero channels a
Split sets aside (`onnx_align`), and the NHWC input read by the first conv without a
Transpose (`onnx_input`). Every rewritten graph is run with ONNX Runtime and compared
with the Keras model it was written from."""

from collections import Counter

import keras
import numpy as np
import pytest
from helpers import _randomize_batch_norm, needs_extra
from keras import layers

from keras_autoshuffle import export, folding
from keras_autoshuffle.applications import ShuffleNetV2
from keras_autoshuffle.export.onnx_align import align_channels
from keras_autoshuffle.export.onnx_input import read_input_as_columns
from keras_autoshuffle.unit_layers import ChannelSlice

pytestmark = needs_extra("onnx")


def _run(proto, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"input": x})[0]


def _weights(proto):
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def _concat_channels(proto):
    """The channels of every Concat's output (ONNX shape inference)."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(proto)
    channels = {
        i.name: i.type.tensor_type.shape.dim[1].dim_value for i in inferred.graph.value_info
    }
    return [channels[n.output[0]] for n in proto.graph.node if n.op_type == "Concat"]


def test_the_gathers_of_a_folded_v2_are_padded_and_the_outputs_kept():
    # v2 1.0x folded: the gathers of stage 2 have 58 channels, of stage 3 116; ONNX
    # Runtime leaves a dense conv reading them on its NCHW path (not a multiple of 8).
    common = {"input_shape": (64, 64, 3), "classes": 10, "classifier_activation": None}
    model = ShuffleNetV2(1.0, stem="imagenet", **common)
    _randomize_batch_norm(model, np.random.default_rng(5))
    folded = folding.fold_model(model)
    proto = export.onnx_graph(folded)
    before = _concat_channels(proto)
    assert sorted(set(c % 8 for c in before)) == [0, 2, 4], before
    # 24 convs (conv1 and conv2 of the units of stages 2 and 3) and 10 gathers: units 2-4
    # of stage 2 (58 -> 64) and 2-8 of stage 3 (116 -> 120); the stage ends also feed a
    # depthwise conv and are left alone (stage 2's: 116 channels).
    assert align_channels(proto, 8) == 34
    assert align_channels(proto, 8) == 0
    after = _concat_channels(proto)
    assert [c for c in after if c % 8] == [116], after
    x = np.random.default_rng(1).normal(size=(2, 64, 64, 3)).astype("float32")
    expected = export.keras_outputs(model, x)
    assert np.max(np.abs(expected)) > 1e-2
    np.testing.assert_allclose(_run(proto, x), expected, atol=2e-5, rtol=0)


def _two_producers():
    """Two convs, each sliced; two concatenations of their slices, each read by a 1x1 conv:
    6 channels (5 + 1) and 10 (5 + 5)."""
    inputs = keras.Input((6, 6, 3))
    a = layers.ReLU()(layers.Conv2D(10, 3, padding="same")(inputs))
    b = layers.ReLU()(layers.Conv2D(6, 1)(inputs))
    a1, a2 = ChannelSlice(0, 5)(a), ChannelSlice(5, 10)(a)
    b1, b2 = ChannelSlice(0, 1)(b), ChannelSlice(1, 6)(b)
    small = layers.Conv2D(4, 1)(layers.Concatenate()([a1, b1]))
    large = layers.Conv2D(4, 1)(layers.Concatenate()([a2, b2]))
    return keras.Model(inputs, layers.Concatenate()([small, large]))


def test_a_set_of_exactly_the_zero_channels_needed_is_taken_before_one_is_carved():
    model = _two_producers()
    proto = export.onnx_graph(model)
    # The convs: 10 -> 16 (6 zeros), 6 -> 8 (2 zeros). The 6-channel concat needs 2: the
    # second conv's 2, whole (carving 2 of the first's 6 would leave 4); the 10-channel one
    # needs 6: the first conv's 6, whole. No Split is cut further.
    assert align_channels(proto, 8) == 4
    assert _concat_channels(proto)[:2] == [8, 16]
    splits = [n for n in proto.graph.node if n.op_type == "Split"]
    sizes = sorted(_weights(proto)[s.input[1]].tolist() for s in splits)
    assert sizes == [[1, 5, 2], [5, 5, 6]], sizes
    x = np.random.default_rng(2).normal(size=(3, 6, 6, 3)).astype("float32")
    np.testing.assert_allclose(_run(proto, x), export.keras_outputs(model, x), atol=1e-5)


def _unread_channels(zero):
    """A 16-channel conv of which a concatenation reads 5 (with 1 of an 8-channel one):
    6 channels. Channels 10-15 nobody reads; `zero`: their weights and bias are zero
    ("kernel": their weights only, the bias not)."""
    inputs = keras.Input((6, 6, 3))
    conv = layers.Conv2D(16, 3, padding="same")
    a = layers.ReLU()(conv(inputs))
    b = layers.ReLU()(layers.Conv2D(8, 1)(inputs))
    pieces = [ChannelSlice(0, 5)(a), ChannelSlice(5, 10)(a), ChannelSlice(0, 1)(b)]
    y = layers.Conv2D(4, 1)(layers.Concatenate()([pieces[0], pieces[2]]))
    model = keras.Model(inputs, layers.Concatenate()([y, pieces[1]]))
    if zero:
        kernel, bias = conv.get_weights()
        kernel[..., 10:], bias[10:] = 0, 0 if zero is True else 0.5
        conv.set_weights([kernel, bias])
    return model


@pytest.mark.parametrize("zero", [True, False, "kernel"])
def test_only_channels_that_are_zero_whatever_the_input_pad_a_concatenation(zero):
    # The same graph three times; only the unread channels' weights and bias differ.
    model = _unread_channels(zero)
    proto = export.onnx_graph(model)
    padded = zero is True
    assert align_channels(proto, 8) == int(padded)
    assert _concat_channels(proto)[0] == (8 if padded else 6)
    if padded:  # 2 of the 6 unread zero channels carved off: Split sizes 5, 5, 2, 4
        sizes = [
            _weights(proto)[n.input[1]].tolist() for n in proto.graph.node if n.op_type == "Split"
        ]
        assert [5, 5, 2, 4] in sizes, sizes
    x = np.random.default_rng(2).normal(size=(3, 6, 6, 3)).astype("float32")
    np.testing.assert_allclose(_run(proto, x), export.keras_outputs(model, x), atol=1e-5)


def test_zero_channels_another_concatenation_reads_are_shared_never_carved():
    # A 10-channel conv (padded: 6 zeros) and an 8-channel one (no zeros). The first
    # concatenation (1 + 1 channels) takes the 6 zeros whole; the second (9 + 5 = 14)
    # would need 2 of them, but they are read: carving them would shrink the first.
    inputs = keras.Input((5, 5, 3))
    a = layers.ReLU()(layers.Conv2D(10, 1)(inputs))
    b = layers.ReLU()(layers.Conv2D(8, 1)(inputs))
    first = layers.Concatenate()([ChannelSlice(0, 1)(a), ChannelSlice(0, 1)(b)])
    second = layers.Concatenate()([ChannelSlice(1, 10)(a), ChannelSlice(1, 6)(b)])
    y = [layers.Conv2D(3, 1)(first), layers.Conv2D(3, 1)(second)]
    model = keras.Model(inputs, layers.Concatenate()(y))
    proto = export.onnx_graph(model)
    assert align_channels(proto, 8) == 2  # the 10-channel conv and the first concatenation
    assert _concat_channels(proto)[:2] == [8, 14]
    x = np.random.default_rng(7).normal(size=(2, 5, 5, 3)).astype("float32")
    np.testing.assert_allclose(_run(proto, x), export.keras_outputs(model, x), atol=1e-5)


def _stem(build, shape):
    inputs = keras.Input(shape)
    x = build(inputs)
    x = layers.GlobalAveragePooling2D()(layers.ReLU()(layers.Conv2D(5, 1)(x)))
    return keras.Model(inputs, layers.Dense(3)(x))


@pytest.mark.parametrize(
    "build, shape",
    [
        # TensorFlow's 'same' with stride 2 on odd sides: pads (0, 1) and (1, 1).
        (lambda x: layers.Conv2D(8, 3, strides=2, padding="same")(x), (17, 15, 3)),
        (lambda x: layers.Conv2D(8, (5, 3), strides=(1, 2), padding="valid")(x), (12, 13, 4)),
        # A ZeroPadding2D merged into the conv's pads.
        (
            lambda x: layers.Conv2D(6, 3, strides=2)(layers.ZeroPadding2D(((1, 2), (3, 0)))(x)),
            (9, 11, 2),
        ),
    ],
)
def test_the_first_conv_reads_the_nhwc_input_as_columns(build, shape):
    model = _stem(build, shape)
    proto = export.onnx_graph(model)
    assert read_input_as_columns(proto)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["Transpose"] == 0 and ops["Reshape"] == 1, ops
    x = np.random.default_rng(3).normal(size=(3, *shape)).astype("float32")
    np.testing.assert_allclose(_run(proto, x), export.keras_outputs(model, x), atol=1e-5)


@pytest.mark.parametrize(
    "build, shape",
    [
        # The input read twice: the Transpose stays.
        (lambda x: layers.Concatenate()([layers.Conv2D(4, 1)(x), x]), (6, 6, 3)),
        # A depthwise conv first (grouped): not a one-channel conv of columns.
        (lambda x: layers.DepthwiseConv2D(3)(x), (6, 6, 3)),
        # Unknown width: the Reshape needs width x channels.
        (lambda x: layers.Conv2D(4, 3)(x), (None, None, 3)),
    ],
)
def test_the_input_keeps_its_transpose_where_columns_do_not_apply(build, shape):
    model = _stem(build, shape)
    proto = export.onnx_graph(model)
    assert not read_input_as_columns(proto)
    assert Counter(n.op_type for n in proto.graph.node)["Transpose"] == 1
    sides = [6 if s is None else s for s in shape]
    x = np.random.default_rng(4).normal(size=(2, *sides)).astype("float32")
    np.testing.assert_allclose(_run(proto, x), export.keras_outputs(model, x), atol=1e-5)


def test_export_onnx_writes_a_folded_v2_without_transposes(tmp_path):
    import onnx

    common = {"input_shape": (32, 32, 3), "classes": 4, "classifier_activation": None}
    model = folding.fold_model(ShuffleNetV2(0.5, stem="imagenet", **common))
    path = export.export_onnx(model, str(tmp_path / "model.onnx"))
    ops = Counter(n.op_type for n in onnx.load(path).graph.node)
    assert ops["Transpose"] == 0 and ops["Reshape"] == 1, ops
    x = np.random.default_rng(6).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(
        export.open_runner(path).run(x), export.keras_outputs(model, x), atol=2e-5, rtol=0
    )


def test_a_dequantize_only_a_subgraph_reads_is_kept():
    # An If branch reads outer names without listing them as the If node's inputs.
    import onnx
    from onnx import TensorProto, helper

    from keras_autoshuffle.export.onnx_graph import drop_unread_dequantize

    def branch(name):
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1])
        return helper.make_graph(
            [helper.make_node("Identity", ["d"], [f"{name}_y"])], name, [], [out]
        )

    nodes = [
        helper.make_node("DequantizeLinear", ["q", "scale"], ["d"]),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["unread"]),
        helper.make_node("If", ["c"], ["y"], then_branch=branch("a"), else_branch=branch("b")),
    ]
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.UINT8, [1]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.5])
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    proto = helper.make_model(helper.make_graph(nodes, "g", inputs, [output], [scale]))
    assert drop_unread_dequantize(proto) == 1
    assert [node.output[0] for node in proto.graph.node] == ["d", "y"]
    onnx.checker.check_model(proto)
