"""torchvision's ShuffleNetV2 weights: logits parity, converter errors, warm start.

The fixture `fixtures/torchvision_shufflenet_v2_x0_5.npz` was written by torchvision
itself (torch 2.14.1, torchvision 0.29.1): `shufflenet_v2_x0_5(weights=None,
num_classes=10)` with seeded He-normal convs and random BatchNorm statistics, in eval
mode, its state dict, one image at 224x224 and one at 225x225 (an even and an odd side)
and torchvision's logits for them. Remake it with (needs torch and torchvision):

    python scripts/make_torchvision_fixture.py --width 0.5 --classes 10 \\
        --output tests/fixtures/torchvision_shufflenet_v2_x0_5.npz
"""

import json
import os

import keras
import numpy as np
import pytest
from helpers import _randomize_batch_norm, tiny_v1, tiny_v2

from keras_autoshuffle import folding
from keras_autoshuffle.applications import (
    AutoShuffleNetV2,
    ShuffleNetV1,
    ShuffleNetV2,
    load_torchvision_weights,
)
from keras_autoshuffle.applications.weights.pretrained import mark_padding

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torchvision_shufflenet_v2_x0_5.npz")


@pytest.fixture(scope="module")
def reference():
    with np.load(FIXTURE) as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(str(arrays.pop("meta")))
    state_dict = {k.removeprefix("weights/"): v for k, v in arrays.items() if "weights/" in k}
    return meta, state_dict, arrays


def _v2(side=224, **kwargs):
    options = dict(width=0.5, stem="imagenet", classes=10, classifier_activation=None)
    return ShuffleNetV2(input_shape=(side, side, 3), **{**options, **kwargs})


@pytest.mark.parametrize("side", [224, 225])
def test_logits_equal_torchvisions(reference, side):
    meta, state_dict, arrays = reference
    assert (meta["width"], meta["classes"]) == (0.5, 10)
    model = load_torchvision_weights(_v2(side), state_dict)
    logits = model.predict(arrays[f"inputs_{side}"], verbose=0)
    expected = arrays[f"logits_{side}"]
    assert np.abs(expected).max() > 1  # the fixture's logits depend on the whole net
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4)
    if side == 224:
        # The folded manual net is the same function, no GATHER and no transpose.
        folded = folding.fold_model(model)
        np.testing.assert_allclose(
            folded.predict(arrays["inputs_224"], verbose=0), expected, rtol=0, atol=1e-4
        )


def test_warm_started_relaxed_net_equals_the_pretrained_manual_one(reference):
    _, state_dict, arrays = reference
    auto = AutoShuffleNetV2(
        0.5,
        stem="imagenet",
        classes=10,
        classifier_activation=None,
        input_shape=(224, 224, 3),
        shuffle_initializer="manual",
    )
    load_torchvision_weights(auto, state_dict)
    logits = auto.predict(arrays["inputs_224"], verbose=0)
    np.testing.assert_allclose(logits, arrays["logits_224"], rtol=0, atol=1e-4)


# On JAX these would compile another real-size net for the computation that
# test_logits_equal_torchvisions already checks there; what they add (which keys load, the
# file's padding mark) is NumPy and h5 work, the same on every backend.
SAME_COMPUTATION = pytest.mark.tensorflow_only(
    reason="the computation test_logits_equal_torchvisions checks on every backend"
)


@SAME_COMPUTATION
def test_backbone_loads_without_the_classifier(reference):
    _, state_dict, arrays = reference
    backbone = load_torchvision_weights(_v2(include_top=False, pooling="avg"), state_dict)
    features = backbone.predict(arrays["inputs_224"], verbose=0)
    fc = state_dict["fc.weight"]
    np.testing.assert_allclose(
        features @ fc.T + state_dict["fc.bias"], arrays["logits_224"], rtol=0, atol=1e-4
    )


def _error(model, state_dict):
    with pytest.raises(ValueError) as info:
        load_torchvision_weights(model, state_dict)
    return str(info.value)


@pytest.mark.tensorflow_only(reason="the converter's checks of NumPy arrays, not computation")
def test_converter_errors_name_the_mismatch(reference):
    _, state_dict, _ = reference
    small = _v2(64)
    before = [w.copy() for w in small.get_weights()]
    message = _error(ShuffleNetV2(1.0, stem="imagenet", input_shape=(64, 64, 3)), state_dict)
    assert "width 0.5" in message and "width 1.0" in message and "width=0.5" in message
    message = _error(_v2(64, classes=1000), state_dict)
    assert "fc.weight" in message and "10 classes" in message and "classes=10" in message
    missing = {k: v for k, v in state_dict.items() if k != "stage3.2.branch2.3.weight"}
    assert "stage3.2.branch2.3.weight" in _error(small, missing)
    assert "stage5.0.weight" in _error(small, {**state_dict, "stage5.0.weight": np.ones(3)})
    broken = {**state_dict, "conv5.1.running_var": np.full(1024, np.nan, np.float32)}
    assert "conv5.1.running_var" in _error(small, broken) and "NaN" in _error(small, broken)
    text = {**state_dict, "conv1.1.bias": np.array(["a"] * 24)}
    assert "conv1.1.bias" in _error(small, text)
    assert "stem='imagenet'" in _error(_v2(64, stem="cifar"), state_dict)
    assert "padding='torch'" in _error(_v2(64, padding="same"), state_dict)
    v1 = ShuffleNetV1(0.5, 3, stem="imagenet", input_shape=(64, 64, 3))
    assert "ShuffleNetV2" in _error(v1, state_dict)
    assert "mapping" in _error(small, list(state_dict.values()))
    # Nothing was assigned by the failed calls.
    for old, new in zip(before, small.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)


V1_ON_TF = pytest.mark.tensorflow_only(
    reason="v2 covers the JAX path; v1's grouped convs compile for 45 s"
)


@pytest.mark.parametrize(
    "build, kwargs",
    [
        (tiny_v2, {}),
        pytest.param(tiny_v1, {"groups": 3}, marks=V1_ON_TF),
        # g = 1: the manual net has no shuffle layers, the learned one starts at identities.
        pytest.param(tiny_v1, {"groups": 1}, marks=V1_ON_TF),
    ],
    ids=["v2", "v1_g3", "v1_g1"],
)
def test_learned_net_starts_from_a_manual_weights_file(tmp_path, build, kwargs):
    # Tiny nets (tests/helpers.py) with the ImageNet stem: the weights file's layout and
    # the shuffles' start are what matter, not the size.
    common = dict(input_shape=(32, 32, 3), stem="imagenet", classes=5, classifier_activation=None)
    pretrained = build(shuffle="manual", **common, **kwargs)
    _randomize_batch_norm(pretrained, np.random.default_rng(0))
    path = str(tmp_path / "manual.weights.h5")
    pretrained.save_weights(path)
    warm = build(shuffle="auto", weights=path, shuffle_initializer="manual", **common, **kwargs)
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(pretrained(x, training=False))
    assert np.abs(expected).max() > 1e-2
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(warm(x, training=False)), expected)
    # "random" starts the matrices where the paper does: the same weights, another net.
    cold = build(shuffle="auto", weights=path, **common, **kwargs)
    assert np.abs(keras.ops.convert_to_numpy(cold(x, training=False)) - expected).max() > 1e-4


def test_stride_two_layers_pad_as_pytorch():
    # PyTorch's AvgPool2d(3, 2, padding=1) divides by 9 at the border
    # (count_include_pad): a corner of an all-ones map averages 4 ones.
    model = tiny_v1(groups=3, stem="imagenet", input_shape=(32, 32, 3))
    pool = keras.Model(
        model.get_layer("stage2_unit1_pool_pad").input, model.get_layer("stage2_unit1_pool").output
    )
    channels = model.get_layer("stem_conv").filters
    out = keras.ops.convert_to_numpy(pool(np.ones((1, 8, 8, channels), "float32")))
    assert out.shape == (1, 4, 4, channels)
    np.testing.assert_allclose(out[0, 0, 0], 4 / 9, rtol=1e-6)
    np.testing.assert_allclose(out[0, 1, 1], 1.0, rtol=1e-6)
    names = {layer.name for layer in model.layers}
    assert {"stem_conv_pad", "stem_pool_pad", "stage3_unit1_dwconv_pad"} <= names
    assert model.get_layer("stage3_unit1_dwconv").padding == "valid"
    assert model.get_layer("stage3_unit2_dwconv").padding == "same"


@SAME_COMPUTATION
def test_converted_weights_fit_only_nets_with_the_torch_padding(tmp_path, reference):
    _, state_dict, arrays = reference
    path = str(tmp_path / "x0_5.weights.h5")
    load_torchvision_weights(_v2(224), state_dict).save_weights(path)
    mark_padding(path, "torch")  # as scripts/convert_torchvision_weights.py does
    loaded = _v2(224, weights=path)
    logits = loaded.predict(arrays["inputs_224"], verbose=0)
    np.testing.assert_allclose(logits, arrays["logits_224"], rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="padding='torch'.*Received: padding='same'"):
        _v2(224, weights=path, padding="same")


def test_conversion_command_reads_the_width_and_classes(reference):
    from keras_autoshuffle.commands import convert_weights as script

    _, state_dict, _ = reference
    model = script.model_for(state_dict)
    assert (model.name, model.output_shape[-1]) == ("shufflenet_v2_x0_5", 10)
    backbone = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
    assert "predictions" not in [layer.name for layer in script.model_for(backbone, False).layers]
    with pytest.raises(SystemExit, match="not a torchvision ShuffleNetV2"):
        script.model_for(backbone)


def test_negative_or_non_finite_batch_norm_statistics_are_refused(reference):
    # (issue 21) A negative running variance makes BatchNorm divide by sqrt(var + eps):
    # the model would output NaN. The error names the key, the index and the value.
    _, state_dict, _ = reference
    small = _v2(64)
    before = [w.copy() for w in small.get_weights()]
    key = "stage3.1.branch2.4.running_var"
    variance = state_dict[key].copy()
    variance[5] = -0.25
    message = _error(small, {**state_dict, key: variance})
    assert "negative BatchNorm variance" in message
    assert message.endswith(f"Received: {key}[5]=-0.25")
    variance[5] = np.inf
    assert _error(small, {**state_dict, key: variance}).endswith(f"Received: {key}[5]=inf")
    mean = state_dict["conv1.1.running_mean"].copy()
    mean[3] = np.nan
    message = _error(small, {**state_dict, "conv1.1.running_mean": mean})
    assert "NaN or inf" in message and message.endswith("conv1.1.running_mean[3]=nan")
    # A variance of 0 is valid (BatchNorm adds epsilon); nothing was assigned before.
    for old, new in zip(before, small.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)
    variance[5] = 0.0
    load_torchvision_weights(small, {**state_dict, key: variance})
