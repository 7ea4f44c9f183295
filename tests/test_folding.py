"""Folding shuffles into weights: exact for v1 (every group count) and v2 (even and odd
channel quarters, as the published widths have), with random, balanced and manual
permutations. Tiny nets (tests/helpers.py): folding depends on the layer structure, not
on the size; tests/test_torchvision_weights.py folds the real 0.5x net."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import (
    TINY_SHAPE,
    TINY_SIDE,
    TINY_UNITS,
    _assert_folds_exactly,
    _layer_counts,
    _randomize_batch_norm,
    needs_extra,
    tiny_v1,
    tiny_v2,
)

import keras_autoshuffle as ka
from keras_autoshuffle import export, folding, hardening, permutations


def _harden_randomly(model, rng, perm_fn=None):
    for layer in ka.relaxed_shuffles(model):
        n = layer.matrix.shape[0]
        layer.harden(rng.permutation(n) if perm_fn is None else perm_fn(layer, n))


# The JAX run folds one case per family (g = 3, even quarters): the other cases change
# channel counts and permutations, not what the backend computes.
ONE_CASE_ON_JAX = pytest.mark.tensorflow_only(
    reason="the same layers as the case the JAX run folds, other channel counts"
)
V1_GROUPS = [
    pytest.param(g, marks=() if g == 3 else ONE_CASE_ON_JAX, id=str(g)) for g in (1, 2, 3, 4, 8)
]


def _balanced_permutation(n, groups, rng):
    """Manual block counts with random within-group orders on both sides."""
    size = n // groups
    sigma, tau = (
        np.concatenate([rng.permutation(size) + k * size for k in range(groups)]) for _ in "st"
    )
    return sigma[permutations.group_shuffle_permutation(n, groups)[tau]]


@pytest.mark.parametrize("groups", V1_GROUPS)
def test_v1_folding_exact(groups):
    common = dict(groups=groups, classes=7, classifier_activation=None)
    manual = tiny_v1(shuffle="manual", **common)
    folded = _assert_folds_exactly(manual, groups, TINY_SIDE)
    # The manual shuffle stays the manual reshape-transpose, once per unit (g > 1) but
    # stage 2 unit 1, whose ungrouped conv1 takes it.
    assert _layer_counts(folded).get("ChannelShuffle", 0) == (TINY_UNITS - 1 if groups > 1 else 0)
    assert _layer_counts(folded).get("ChannelSlice", 0) == 0

    # Learned: every other shuffle random, the others balanced (manual block counts).
    learned = tiny_v1(shuffle="auto", **common)
    rng = np.random.default_rng(groups)
    balanced = 0
    for k, layer in enumerate(ka.relaxed_shuffles(learned)):
        n, g = layer.matrix.shape[0], hardening.shuffle_groups(learned)[layer.name]
        if k % 2 and g:
            perm = layer.harden(_balanced_permutation(n, g, rng))
        else:
            perm = layer.harden(rng.permutation(n))
        # (A random permutation may have the manual block counts by chance, for g = 2.)
        manual_counts = g and permutations.block_counts(
            permutations.group_shuffle_permutation(n, g), g
        )
        balanced += bool(g) and np.array_equal(permutations.block_counts(perm, g), manual_counts)
    folded = _assert_folds_exactly(learned, groups + 10, TINY_SIDE)
    # Stage 2 unit 1 (ungrouped conv1) folds away completely; balanced shuffles become
    # the manual reshape-transpose; random ones slices.
    assert _layer_counts(folded).get("ChannelShuffle", 0) == balanced
    assert (_layer_counts(folded).get("ChannelSlice", 0) > 0) == (groups > 1)


# Stage widths (stem, stages 2-4, head). The published widths' halves are even (0.5x:
# 24, 48, 96; 1.5x: 88, ...) or twice an odd number (1.0x: 58 = 2 x 29; 2.0x: 122);
# "odd_quarters" has halves 6, 10, 18. "x1_0" is the real 1.0x net's channels and units.
V2_CASES = {
    "even_quarters": dict(channels=(8, 16, 32, 64, 64)),
    "odd_quarters": dict(channels=(8, 12, 20, 36, 64)),
    "x1_0": dict(channels=(24, 116, 232, 464, 1024), repeats=(4, 8, 4)),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c == "even_quarters" else ONE_CASE_ON_JAX) for c in V2_CASES],
)
def test_v2_folding_exact(case):
    common = dict(classes=5, classifier_activation=None, **V2_CASES[case])
    manual = tiny_v2(shuffle="manual", **common)
    folded = _assert_folds_exactly(manual, 1, TINY_SIDE)
    assert _layer_counts(folded).get("ChannelShuffle", 0) == 0
    learned = tiny_v2(shuffle="auto", **common)
    _harden_randomly(learned, np.random.default_rng(len(case)))
    _assert_folds_exactly(learned, 2, TINY_SIDE)


@pytest.mark.parametrize("build", [tiny_v2, tiny_v1], ids=["v2", "v1_g3"])
@pytest.mark.parametrize("padding", ["torch", "same"])
def test_folding_keeps_the_padding(build, padding):
    common = dict(stem="cifar", classes=5, classifier_activation=None)
    model = build(shuffle="manual", padding=padding, **common)
    folded = _assert_folds_exactly(model, 3, TINY_SIDE)
    pads = [layer for layer in folded.layers if isinstance(layer, keras.layers.ZeroPadding2D)]
    # Two stride-2 layers per stage with the CIFAR stem (v2: both branches' depthwise
    # convs; v1: the depthwise conv and the average-pool shortcut).
    assert len(pads) == (6 if padding == "torch" else 0)


def test_fold_refuses_relaxed_and_other_models():
    model = tiny_v2(shuffle="auto", classes=3)
    with pytest.raises(ValueError, match="relaxed"):
        folding.fold_model(model)
    inputs = keras.Input((4, 4, 3))
    with pytest.raises(ValueError, match="ShuffleNet"):
        folding.fold_model(keras.Model(inputs, keras.layers.Conv2D(2, 1)(inputs)))


def test_fold_refuses_arguments_of_the_wrong_type():
    with pytest.raises(TypeError, match="Received: model='model.keras'"):
        folding.fold_model("model.keras")
    model = tiny_v2(shuffle="manual", classes=3)
    # A string is truthy: "no" must not silently mean route_manual=True.
    with pytest.raises(TypeError, match="Received: route_manual='no'"):
        folding.fold_model(model, route_manual="no")
    with pytest.raises(TypeError, match="Received: name=3"):
        folding.fold_model(model, name=3)


def _ops_after_delegation(path):
    """The op names of a LiteRT file's nodes once the interpreter applied XNNPACK: the
    file's own ops, then one "DELEGATE" per partition XNNPACK took."""
    return [op["op_name"] for op in export.litert_interpreter(path)._get_ops_details()]


@pytest.mark.tensorflow_only(reason="LiteRT export")
def test_folded_litert_has_no_gather_and_matches(tmp_path):
    model = tiny_v2(shuffle="auto", classes=4, classifier_activation=None)
    _harden_randomly(model, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    _randomize_batch_norm(model, rng)
    x = rng.normal(size=(2, TINY_SIDE, TINY_SIDE, 3)).astype("float32")

    folded = folding.fold_model(model)
    result = export.export_model(folded, str(tmp_path), x, formats=("litert",))
    ops = _ops_after_delegation(result["litert"]["path"])
    assert "GATHER" not in ops
    assert "CONCATENATION" in ops
    assert "STRIDED_SLICE" not in ops  # one conv per slice (`export.litert_graph`)
    # XNNPACK takes the whole graph: one partition (a concatenation of more than 5 inputs
    # would leave it; `folding._MAX_CONCAT_INPUTS`).
    assert ops.count("DELEGATE") == 1, ops
    litert = export.open_runner(result["litert"]["path"]).run(x)
    np.testing.assert_allclose(litert, export.keras_outputs(model, x), atol=1e-4)


@pytest.mark.tensorflow_only(reason="LiteRT export")
def test_a_concatenation_of_many_pieces_stays_in_one_xnnpack_partition(tmp_path):
    # A folded real-size net concatenates up to 9 slices where the tiny nets above make
    # few; `folding._concat` nests them at XNNPACK's limit (6 inputs or more: 2 partitions).
    x = keras.Input((4, 4, 16))
    pieces = [keras.layers.Conv2D(2 + i, 1)(x) for i in range(9)]
    model = keras.Model(x, keras.layers.Conv2D(8, 1)(folding._concat(pieces, "gather")))
    ops = _ops_after_delegation(export.export_litert(model, tmp_path / "m.tflite"))
    assert ops.count("CONCATENATION") == 3 and ops.count("DELEGATE") == 1, ops


@pytest.mark.tensorflow_only(reason="LiteRT export")
def test_folded_int8_litert_requantizes_nothing_between_its_layers(tmp_path):
    # Each reader of a sliced conv had its own requantization of the whole conv output
    # (47 QUANTIZE ops in v2 1.0x); written as one conv per slice, the only QUANTIZE is
    # the float input's.
    model = tiny_v2(classes=4, classifier_activation=None)
    rng = np.random.default_rng(1)
    _randomize_batch_norm(model, rng)
    images = rng.uniform(0, 1, size=(8, TINY_SIDE, TINY_SIDE, 3)).astype("float32")
    folded = folding.fold_model(model)
    path = export.export_int8(folded, tmp_path / "m.tflite", images)
    ops = _ops_after_delegation(path)
    assert ops.count("QUANTIZE") == 1
    assert ops.count("DELEGATE") == 1, ops  # one XNNPACK partition
    assert "STRIDED_SLICE" not in ops
    assert not export.unsupported_layers(folded)  # the rewrite left `folded` as it was


@needs_extra("onnx")
@pytest.mark.tensorflow_only(reason="ONNX export")
def test_folded_int8_onnx_dequantizes_only_what_is_read(tmp_path):
    # Channels that are not multiples of 8: `onnx_align` sets zero channels aside in Split
    # outputs nothing reads; their DequantizeLinear ran on every call (10 in v2 1.0x).
    import onnx

    from keras_autoshuffle.export.int8_runtimes import export_onnx_int8

    model = tiny_v2(classes=4, classifier_activation=None, channels=(8, 20, 36, 52, 32))
    float_path = export.export_onnx(folding.fold_model(model), tmp_path / "m.onnx")
    images = np.random.default_rng(0).uniform(0, 1, size=(8, *TINY_SHAPE)).astype("float32")
    graph = onnx.load(export_onnx_int8(float_path, tmp_path / "m_int8.onnx", images)).graph
    read = {name for node in graph.node for name in node.input} | {graph.output[0].name}
    dequantize = [node for node in graph.node if node.op_type == "DequantizeLinear"]
    assert dequantize and all(node.output[0] in read for node in dequantize)
    assert any(name.endswith("_zeros") for node in graph.node for name in node.output)


def test_folded_model_round_trips_safe_mode(tmp_path):
    model = tiny_v1(groups=3, shuffle="auto", classes=3)
    _harden_randomly(model, np.random.default_rng(0))
    folded = folding.fold_model(model)
    assert _layer_counts(folded).get("ChannelSlice", 0) > 0
    x = np.random.default_rng(2).normal(size=(2, TINY_SIDE, TINY_SIDE, 3)).astype("float32")
    result = export.export_model(folded, str(tmp_path), x, formats=("keras",))
    assert result["keras"]["max_abs_diff"] <= 1e-6


@pytest.mark.tensorflow_only(reason="NumPy only, the same on every backend")
def test_decompose_recovers_perm():
    rng = np.random.default_rng(0)
    n, g = 12, 3
    manual = permutations.group_shuffle_permutation(n, g)
    perm = hardening.nearest_balanced_permutation(rng.random((n, n)), g)
    sigma, tau = permutations.decompose(perm, manual, g)
    np.testing.assert_array_equal(sigma[manual[tau]], perm)
    for p in (sigma, tau):
        np.testing.assert_array_equal(p // (n // g), np.arange(n) // (n // g))


def test_folded_v2_keras_file_loads_in_a_fresh_process_after_import(tmp_path):
    # ChannelSlice (defined outside the builders) must be registered by
    # `import keras_autoshuffle` alone.
    model = tiny_v2(shuffle="auto", classes=3)
    _harden_randomly(model, np.random.default_rng(4))
    folded = folding.fold_model(model)
    counts = _layer_counts(folded)
    assert counts.get("ChannelSlice", 0) > 0
    path, x_path, y_path = tmp_path / "folded.keras", tmp_path / "x.npy", tmp_path / "y.npy"
    folded.save(path)
    x = np.random.default_rng(5).normal(size=(2, TINY_SIDE, TINY_SIDE, 3)).astype("float32")
    np.save(x_path, x)
    code = (
        "import sys, numpy as np, keras, keras_autoshuffle\n"
        "m = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
        "np.save(sys.argv[3], keras.ops.convert_to_numpy(m(np.load(sys.argv[2]))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path), str(x_path), str(y_path)],
        capture_output=True,
        text=True,
        timeout=300,
        # Keras's NumPy backend: registration is the package's import, whatever the
        # backend; the child imports JAX (that backend's convolutions), not TensorFlow.
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "numpy"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = keras.ops.convert_to_numpy(folded(x))
    np.testing.assert_allclose(np.load(y_path), expected, atol=1e-6, rtol=0)


def test_a_layer_renamed_outside_the_description_fails_loudly():
    # Builders and folding share applications/architecture.py; a layer renamed in one
    # place only must stop folding and balanced hardening, not fold a wrong network.
    model = tiny_v2(shuffle="auto", classes=3)
    model.get_layer("stage3_unit2_dwbn").name = "stage3_unit2_dw_bn"
    with pytest.raises(ValueError, match="stage3_unit2_dwbn"):
        ka.harden_model(model, balanced=True)
    _harden_randomly(model, np.random.default_rng(0))
    with pytest.raises(ValueError, match="lacks layers.*stage3_unit2_dwbn"):
        folding.fold_model(model)
    v1 = tiny_v1(groups=3, classes=3)
    v1.get_layer("stage3_unit3_add").name = "stage3_unit3_sum"
    with pytest.raises(ValueError, match="stage3_unit3_add"):
        folding.fold_model(v1)


def test_one_conv_per_slice_splits_only_columns_it_may():
    # A relu conv read only by slices becomes one conv per slice (same outputs); a softmax
    # over the channels cannot be cut into columns, so that model is returned as it is.
    from keras_autoshuffle.export.litert_graph import one_conv_per_slice

    x = np.random.default_rng(0).normal(size=(2, 4, 4, 3)).astype("float32")
    for activation, rewritten in (("relu", True), ("softmax", False)):
        inputs = keras.Input((4, 4, 3))
        y = keras.layers.Conv2D(6, 1, activation=activation)(inputs)
        y = keras.layers.Concatenate()([ka.ChannelSlice(3, 6)(y), ka.ChannelSlice(0, 3)(y)])
        model = keras.Model(inputs, y)
        new = one_conv_per_slice(model)
        assert (new is not model) == rewritten
        assert _layer_counts(new).get("ChannelSlice", 0) == (0 if rewritten else 2)
        np.testing.assert_allclose(new(x), model(x), atol=1e-6)


def test_one_conv_per_slice_keeps_graphs_it_cannot_copy_layer_by_layer():
    # Every LiteRT file is written through the rewrite (`export.export_litert`): a keras op
    # (`x / 255`, `y * 2`), a shared layer or a Lambda around a folded net must not make it
    # fail (a Lambda does not load back from its config: Keras's safe mode).
    from keras_autoshuffle.export.litert_graph import one_conv_per_slice

    def folded():
        return folding.fold_model(tiny_v2(classes=3))

    inputs, net = keras.Input(TINY_SHAPE), folded()
    pixels = keras.Model(inputs, net(inputs / 255.0))
    net = folded()
    scaled = keras.Model(net.inputs, net.outputs[0] * 2.0)
    net, dense = folded(), keras.layers.Dense(3)
    shared = keras.Model(net.inputs, dense(keras.layers.ReLU()(dense(net.outputs[0]))))
    net = folded()
    doubled = keras.Model(net.inputs, keras.layers.Lambda(lambda t: t * 2)(net.outputs[0]))
    inputs, net = keras.Input(TINY_SHAPE), folded()
    lambda_pixels = keras.Model(inputs, net(keras.layers.Lambda(lambda t: t / 255)(inputs)))
    x = np.random.default_rng(0).uniform(0, 255, size=(2, *TINY_SHAPE)).astype("float32")
    for model in (pixels, scaled, shared, doubled, lambda_pixels):
        new = one_conv_per_slice(model)
        np.testing.assert_allclose(new(x), model(x), atol=1e-5)
    # The nested folded net behind the op is still rewritten.
    nested = [op for op in one_conv_per_slice(pixels).operations if isinstance(op, keras.Model)]
    assert len(nested) == 1 and not _layer_counts(nested[0]).get("ChannelSlice")


def test_one_conv_per_slice_writes_two_slices_of_one_range_as_one_piece():
    # Each piece is named after its conv and range: two slices of one range made two
    # layers of one name, which keras.Model refuses.
    from keras_autoshuffle.export.litert_graph import one_conv_per_slice

    inputs = keras.Input((4, 4, 3))
    y = keras.layers.Conv2D(6, 1, activation="relu")(inputs)
    y = keras.layers.Add()([ka.ChannelSlice(0, 3)(y), ka.ChannelSlice(0, 3)(y)])
    model = keras.Model(inputs, y)
    new = one_conv_per_slice(model)
    assert _layer_counts(new).get("Conv2D") == 1 and not _layer_counts(new).get("ChannelSlice")
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 3)).astype("float32")
    np.testing.assert_allclose(new(x), model(x), atol=1e-6)


def test_one_conv_per_slice_reaches_a_folded_net_inside_a_wrapper():
    # The fine-tune's int8 LiteRT file is of the folded net behind its input normalisation
    # (a nested model): the rewrite must reach inside it (6 QUANTIZE ops before, 1 after).
    from keras_autoshuffle.export.litert_graph import one_conv_per_slice
    from keras_autoshuffle.export.metadata import with_input_normalization

    model = tiny_v2(classes=4)
    _randomize_batch_norm(model, np.random.default_rng(0))
    wrapper = with_input_normalization(folding.fold_model(model))
    new = one_conv_per_slice(wrapper)
    nested = [op for op in new.operations if isinstance(op, keras.Model)]
    assert len(nested) == 1 and not _layer_counts(nested[0]).get("ChannelSlice")
    x = np.random.default_rng(1).uniform(0, 1, size=(2, *TINY_SHAPE)).astype("float32")
    np.testing.assert_allclose(new(x), wrapper(x), atol=1e-5)
