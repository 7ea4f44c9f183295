"""ONNX and OpenVINO exports: the NCHW graph of the package's nets (`onnx_graph`), the
files written and checked by `export_model`, Keras's exporter for other models, and the
refusal of a missing extra before anything is written or trained.

The round trips skip when the `onnx` / `openvino` extras are not installed."""

from collections import Counter

import keras
import numpy as np
import pytest
from helpers import needs_extra
from keras import layers

from keras_autoshuffle import RelaxedShuffle, export, folding, harden_model
from keras_autoshuffle.applications import AutoShuffleNetV2, ShuffleNetV1, ShuffleNetV2
from keras_autoshuffle.export import checks

needs_onnx = needs_extra("onnx")
needs_openvino = needs_extra("openvino")


def _randomize_batch_norms(model, seed=0):
    """Non-trivial statistics, so that folding BatchNormalization into the convs shows."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, gamma.shape).astype("float32"),
                    rng.normal(0, 0.1, beta.shape).astype("float32"),
                    rng.normal(0, 0.1, mean.shape).astype("float32"),
                    rng.uniform(0.5, 1.5, variance.shape).astype("float32"),
                ]
            )
    return model


def _images(side, batch=2):
    return np.random.default_rng(1).normal(size=(batch, side, side, 3)).astype("float32")


def _nets():
    """{name: model}: v2 manual / hardened-and-folded (ImageNet stem), v1 g3 manual."""
    common = {"input_shape": (64, 64, 3), "classes": 10, "classifier_activation": None}
    manual = _randomize_batch_norms(ShuffleNetV2(0.5, stem="imagenet", **common))
    learned = AutoShuffleNetV2(0.5, stem="imagenet", **common)
    harden_model(learned)
    learned = _randomize_batch_norms(learned, seed=2)
    v1 = ShuffleNetV1(groups=3, width=0.25, **common)
    return {
        "v2_manual": manual,
        "v2_folded": folding.fold_model(learned),
        "v2_hardened_reference": learned,
        "v1_manual": _randomize_batch_norms(v1, seed=3),
    }


@pytest.fixture(scope="module")
def nets():
    return _nets()


@needs_onnx
@pytest.mark.parametrize("name", ["v2_manual", "v2_folded", "v2_hardened_reference", "v1_manual"])
def test_onnx_graph_is_nchw_and_matches_keras(nets, name):
    import onnxruntime  # noqa: F401

    model = nets[name]
    proto = export.onnx_graph(model)
    ops = Counter(node.op_type for node in proto.graph.node)
    # One layout change (the NHWC input); no BatchNormalization left: folded into convs.
    assert ops["Transpose"] == 1 + ops["Reshape"] // 2, ops
    assert "BatchNormalization" not in ops and "Mul" not in ops and "Pad" not in ops, ops
    convs = sum(isinstance(layer, layers.Conv2D | layers.DepthwiseConv2D) for layer in model.layers)
    assert ops["Conv"] == convs
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = _images(64)
    expected = export.keras_outputs(model, x)
    assert np.max(np.abs(expected)) > 1e-2
    got = session.run(None, {"input": x})[0]
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)


@needs_onnx
def test_folded_graph_has_no_shuffle_ops(nets):
    ops = Counter(node.op_type for node in export.onnx_graph(nets["v2_folded"]).graph.node)
    assert ops["Transpose"] == 1 and ops["Reshape"] == 0, ops
    manual = Counter(node.op_type for node in export.onnx_graph(nets["v2_manual"]).graph.node)
    assert manual["Transpose"] == 1 + 16, manual  # ShuffleNet v2's 16 channel shuffles


@needs_onnx
@needs_openvino
def test_export_model_writes_and_checks_onnx_and_openvino(nets, tmp_path):
    model, reference = nets["v2_folded"], nets["v2_hardened_reference"]
    x = _images(64, batch=3)
    result = export.export_model(
        model, str(tmp_path), x, formats=("onnx", "openvino"), reference=reference
    )
    assert set(result) == {"onnx", "openvino"}
    assert (tmp_path / "model.onnx").is_file()
    assert (tmp_path / "openvino" / "model.xml").is_file()
    assert (tmp_path / "openvino" / "model.bin").is_file()
    for name in ("onnx", "openvino"):
        assert result[name]["max_abs_diff"] <= 1e-4, (name, result[name])
    # The files run on another batch size too, and still match the hardened net.
    y = _images(64, batch=1)
    expected = export.keras_outputs(reference, y)
    np.testing.assert_allclose(
        export.open_runner(str(tmp_path / "model.onnx")).run(y), expected, atol=1e-4
    )
    np.testing.assert_allclose(
        export.open_runner(str(tmp_path / "openvino")).run(y), expected, atol=1e-4
    )


def _other_model():
    """A layer `onnx_graph` does not take (LayerNormalization): Keras's exporter writes it."""
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(6, 3, padding="same")(inputs)
    x = layers.LayerNormalization()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(4)(x))


@needs_onnx
@needs_openvino
@pytest.mark.tensorflow_only(
    reason="Keras's ONNX exporter is tf2onnx on TensorFlow; on JAX it needs jax2onnx"
)
def test_other_layers_go_through_keras_exporter(tmp_path):
    model = _other_model()
    assert export.unsupported_layers(model)
    with pytest.raises(ValueError, match="layer_normalization"):
        export.onnx_graph(model)
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    result = export.export_model(model, str(tmp_path), x, formats=("onnx", "openvino"))
    for name in ("onnx", "openvino"):
        assert result[name]["max_abs_diff"] <= 1e-4, (name, result[name])


def _without(monkeypatch, module):
    real = checks.is_installed
    monkeypatch.setattr(checks, "is_installed", lambda name: name != module and real(name))


@pytest.mark.parametrize(
    ("fmt", "module"), [("onnx", "onnxruntime"), ("openvino", "openvino"), ("onnx", "tf2onnx")]
)
def test_a_missing_extra_is_refused_before_writing(monkeypatch, tmp_path, fmt, module):
    _without(monkeypatch, module)
    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, layers.Conv2D(2, 1)(inputs))
    with pytest.raises(
        ValueError, match=rf"needs [^(]*{module}.*pip install 'keras-autoshuffle\[{fmt}\]'"
    ):
        export.export_model(model, str(tmp_path / "out"), np.ones((1, 4, 4, 3)), formats=(fmt,))
    assert not (tmp_path / "out").exists()


def test_float32_only(monkeypatch):
    # As if every extra were installed: what is left is the dtype (on any install).
    monkeypatch.setattr(checks, "is_installed", lambda module: True)
    reasons = export.unsupported_formats(("onnx", "openvino"), ("float32", "bfloat16"))
    assert set(reasons) == {"onnx", "openvino"}
    assert all("bfloat16" in why for why in reasons.values())


def test_the_cli_refuses_a_missing_extra_before_training(monkeypatch, tmp_path):
    _without(monkeypatch, "onnxruntime")
    from keras_autoshuffle.commands import train

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit:
        train.main(["--dataset", "digits", "--output", str(out), "--export-formats", "onnx"])
    assert "pip install 'keras-autoshuffle[onnx]'" in str(exit.value.code)
    assert "Received: --export-formats onnx" in str(exit.value.code)
    assert not out.exists()


@needs_onnx
def test_channels_padded_for_blocked_kernels_keep_the_outputs():
    import onnxruntime
    from onnx import numpy_helper

    from keras_autoshuffle.export.onnx_align import align_channels

    # v2 1.0x: 58-channel branches in stage 2, 116 in stage 3 (0.5x has 24 / 48: aligned).
    common = {"input_shape": (64, 64, 3), "classes": 10, "classifier_activation": None}
    model = _randomize_batch_norms(ShuffleNetV2(1.0, stem="imagenet", **common), seed=4)
    folded = folding.fold_model(model)
    plain = export.onnx_graph(folded)
    aligned = export.onnx_graph(folded)
    # conv1 and conv2 of each unit of stages 2 and 3 (58 and 116 channels): 2 x (4 + 8),
    # and 10 concatenations (tests/test_onnx_rewrites.py)
    assert align_channels(aligned, 8) == 24 + 10
    assert align_channels(aligned, 8) == 0  # nothing left to pad
    rows = [
        numpy_helper.to_array(t).shape[0]
        for t in aligned.graph.initializer
        if t.name.endswith("_w")
    ]
    assert sum(r % 8 != 0 for r in rows) < sum(
        numpy_helper.to_array(t).shape[0] % 8 != 0
        for t in plain.graph.initializer
        if t.name.endswith("_w")
    )
    x = _images(64)
    expected = export.keras_outputs(model, x)
    for proto in (plain, aligned):
        session = onnxruntime.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        np.testing.assert_allclose(session.run(None, {"input": x})[0], expected, atol=2e-5)


@needs_onnx
@needs_openvino
def test_hardened_shuffles_export_as_gathers(tmp_path):
    # A grouped Conv2D (Keras's exporter gives ONNX Runtime an op it lacks) and a hardened
    # learned shuffle: written by onnx_graph, the shuffle a Gather.
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(12, 3, padding="same")(inputs)
    x = RelaxedShuffle(seed=3)(layers.ReLU()(x))
    x = layers.Conv2D(12, 1, groups=3)(x)
    model = keras.Model(inputs, layers.Dense(5)(layers.GlobalAveragePooling2D()(x)))
    harden_model(model)
    assert not export.unsupported_layers(model)
    ops = Counter(node.op_type for node in export.onnx_graph(model).graph.node)
    assert ops["Gather"] == 1
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    result = export.export_model(model, str(tmp_path), x, formats=("onnx", "openvino"))
    for name in ("onnx", "openvino"):
        assert result[name]["max_abs_diff"] <= 1e-4, (name, result[name])


@needs_onnx
def test_spatial_concatenation_maps_to_the_nchw_axis():
    import onnxruntime

    inputs = keras.Input((4, 6, 3))
    x = layers.Concatenate(axis=1)([inputs, layers.Conv2D(3, 1)(inputs)])  # along the height
    model = keras.Model(inputs, layers.Concatenate(axis=-1)([x, x]))
    session = onnxruntime.InferenceSession(
        export.onnx_graph(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(0).normal(size=(2, 4, 6, 3)).astype("float32")
    got = session.run(None, {"input": x})[0]  # NHWC out, as the Keras model's
    np.testing.assert_allclose(got, model(x), atol=1e-6)


def _softmax_on_images():
    inputs = keras.Input((4, 5, 3))
    return keras.Model(inputs, layers.Activation("softmax")(layers.Conv2D(6, 1)(inputs)))


def _batch_norm_not_on_channels():
    inputs = keras.Input((4, 5, 3))
    return keras.Model(inputs, layers.BatchNormalization(axis=1)(layers.Conv2D(6, 1)(inputs)))


def _batch_norm_of_features():
    inputs = keras.Input((4, 5, 3))
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(6, 1)(inputs))
    return keras.Model(inputs, layers.BatchNormalization()(x))


def _shuffle_of_unknown_sides():
    from keras_autoshuffle import ChannelShuffle

    inputs = keras.Input((None, None, 3))
    return keras.Model(inputs, ChannelShuffle(2)(layers.Conv2D(6, 1)(inputs)))


def _same_conv_of_unknown_sides():
    inputs = keras.Input((None, None, 3))
    return keras.Model(inputs, layers.Conv2D(4, 3, strides=2, padding="same")(inputs))


@needs_onnx
@pytest.mark.tensorflow_only(
    reason="Keras's ONNX exporter is tf2onnx on TensorFlow; on JAX it needs jax2onnx"
)
@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (_softmax_on_images, "activation: Activation(activation=softmax) of rank 4"),
        (_batch_norm_not_on_channels, "batch_normalization: BatchNormalization(axis=1) of rank 4"),
        (_batch_norm_of_features, "BatchNormalization(axis=-1) of rank 2"),
        (_shuffle_of_unknown_sides, "channel_shuffle: ChannelShuffle on unknown spatial sides"),
        (_same_conv_of_unknown_sides, "Conv2D on unknown spatial sides (None, None)"),
    ],
)
def test_what_the_nchw_writer_would_get_wrong_goes_through_keras_exporter(tmp_path, build, reason):
    # The NCHW graph would put these on the wrong axis (or fail on a None side): the
    # writer declines them, naming why, and Keras's exporter writes the file.
    import onnx

    model = _randomize_batch_norms(build())
    assert any(reason in why for why in export.unsupported_layers(model)), (
        export.unsupported_layers(model)
    )
    with pytest.raises(ValueError, match="onnx_graph cannot write"):
        export.onnx_graph(model)
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 3)).astype("float32")
    result = export.export_model(model, str(tmp_path), x, formats=("onnx",))
    assert result["onnx"]["max_abs_diff"] <= 1e-4, result
    assert onnx.load(str(tmp_path / "model.onnx")).producer_name != "keras_autoshuffle"
    expected = export.keras_outputs(model, x)
    assert np.max(np.abs(expected)) > 1e-2
    np.testing.assert_allclose(
        export.open_runner(str(tmp_path / "model.onnx")).run(x), expected, atol=1e-4
    )


@needs_onnx
def test_a_batch_norm_over_the_channels_after_another_layer_stays_nchw():
    # Not folded into a conv (a ReLU is between): a scale and a shift over the channels.
    import onnxruntime

    inputs = keras.Input((4, 5, 3))
    x = layers.BatchNormalization()(layers.ReLU()(layers.Conv2D(6, 1)(inputs)))
    model = _randomize_batch_norms(keras.Model(inputs, x))
    assert not export.unsupported_layers(model)
    proto = export.onnx_graph(model)
    assert {"Mul", "Add"} <= {node.op_type for node in proto.graph.node}
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 3)).astype("float32")
    np.testing.assert_allclose(
        session.run(None, {"input": x})[0], export.keras_outputs(model, x), atol=1e-5
    )
