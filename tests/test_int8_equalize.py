"""Equal channel ranges before int8 (`experiments.int8_equalize.equalize_ranges`, the
lever the experiment measures): the copy computes the same function, each matched
tensor's channels end with one range on the calibration images (recomputed here from the
layers' outputs), and only what commutes with a per-channel scale is matched: the
experiment's paired comparison rests on these."""

import keras
import numpy as np
from helpers import TINY_REPEATS, TINY_SHAPE, _randomize_batch_norm, tiny_v2

from experiments.int8_equalize import equalize_ranges
from keras_autoshuffle import folding
from keras_autoshuffle.export.metadata import with_input_normalization


def _folded_v2(seed=0):
    model = tiny_v2(classes=4)
    _randomize_batch_norm(model, np.random.default_rng(seed))
    return folding.fold_model(model)


def _images(count=32, seed=1):
    return np.random.default_rng(seed).normal(size=(count, *TINY_SHAPE)).astype("float32")


def _changed(before, after):
    pairs = enumerate(zip(before, after, strict=True))
    return [i for i, (a, b) in pairs if not np.array_equal(a, b)]


def test_the_copy_computes_the_same_and_the_model_is_left_as_it_was():
    folded, x = _folded_v2(), _images()
    weights = folded.get_weights()
    expected = keras.ops.convert_to_numpy(folded(x))
    equalized = equalize_ranges(folded, x)
    assert not _changed(weights, folded.get_weights())
    assert _changed(weights, equalized.get_weights())
    np.testing.assert_allclose(equalized(_images(seed=2)), folded(_images(seed=2)), atol=2e-5)
    np.testing.assert_allclose(equalized(x), expected, atol=2e-5)


def test_each_branch_tensor_ends_with_one_range_per_channel():
    # In a v2 branch the ReLU's output before the depthwise conv and the depthwise output
    # before the second 1x1 conv; a down-sampling unit's left branch adds its depthwise
    # output: 2 per unit and 1 per stage.
    folded, x = _folded_v2(), _images()
    equalized = equalize_ranges(folded, x)
    # The convolutions that read them, by the architecture's names.
    taps = [
        layer.input
        for layer in equalized.layers
        if layer.name.endswith(("_dwconv", "_conv2", "_left_conv"))
        and not layer.name.endswith("_left_dwconv")
    ]
    assert len(taps) == 2 * sum(TINY_REPEATS) + len(TINY_REPEATS)
    for values in keras.Model(equalized.inputs[0], taps)(x):
        ranges = np.max(np.abs(keras.ops.convert_to_numpy(values)), axis=(0, 1, 2))
        live = ranges[ranges > 0]  # a ReLU dead on these images stays at 0
        assert len(live) > len(ranges) // 2
        np.testing.assert_allclose(live, np.max(ranges), rtol=1e-4)


def _chain(*middle, consumer=None, scale=True, second_reader=False):
    inputs = keras.Input((5, 5, 4))
    norm = keras.layers.BatchNormalization(scale=scale)
    x = norm(keras.layers.Conv2D(4, 1)(inputs))
    y = x
    for layer in middle:
        y = layer(y)
    y = (consumer or keras.layers.Conv2D(3, 1))(y)
    outputs = [y, keras.layers.Conv2D(2, 1)(x)] if second_reader else y
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        layer.set_weights([rng.uniform(0.2, 3.0, w.shape) for w in layer.get_weights()])
    return model


def test_only_what_commutes_with_a_positive_scale_is_matched():
    x = np.random.default_rng(3).normal(size=(16, 5, 5, 4)).astype("float32")
    matched = {
        "BN, ReLU, padding, depthwise": _chain(
            keras.layers.ReLU(),
            keras.layers.ZeroPadding2D(1),
            consumer=keras.layers.DepthwiseConv2D(3),
        ),
        "BN, 1x1 conv": _chain(),
    }
    left = {
        "ReLU6 clips": _chain(keras.layers.ReLU(max_value=6.0)),
        "a ReLU with a threshold": _chain(keras.layers.ReLU(threshold=0.5)),
        "a grouped conv": _chain(consumer=keras.layers.Conv2D(2, 1, groups=2)),
        "a depth multiplier of 2": _chain(
            consumer=keras.layers.DepthwiseConv2D(1, depth_multiplier=2)
        ),
        "BN without its scale": _chain(scale=False),
        "two readers": _chain(second_reader=True),
    }
    for name, model in {**matched, **left}.items():
        equalized = equalize_ranges(model, x)
        changed = _changed(model.get_weights(), equalized.get_weights())
        assert bool(changed) == (name in matched), name
        outputs = keras.tree.flatten(model(x)), keras.tree.flatten(equalized(x))
        for a, b in zip(*outputs, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_channel_dead_on_the_images_keeps_its_weights():
    model = _chain()
    norm = next(x for x in model.layers if isinstance(x, keras.layers.BatchNormalization))
    gamma, beta, mean, variance = norm.get_weights()
    gamma[1], beta[1] = 0.0, 0.0
    norm.set_weights([gamma, beta, mean, variance])
    x = np.random.default_rng(4).normal(size=(8, 5, 5, 4)).astype("float32")
    equalized = equalize_ranges(model, x)
    new_norm = next(y for y in equalized.layers if isinstance(y, keras.layers.BatchNormalization))
    new_gamma, new_beta = new_norm.get_weights()[:2]
    assert np.all(np.isfinite(new_gamma)) and new_gamma[1] == 0.0 and new_beta[1] == 0.0
    consumer = equalized.layers[-1]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(consumer.kernel)[:, :, 1],
        keras.ops.convert_to_numpy(model.layers[-1].kernel)[:, :, 1],
    )
    np.testing.assert_allclose(equalized(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_folded_net_inside_a_wrapper_is_equalized_on_what_reaches_it():
    folded = _folded_v2()
    wrapper = with_input_normalization(folded)
    x = np.random.default_rng(5).uniform(0, 1, size=(32, *TINY_SHAPE)).astype("float32")
    equalized = equalize_ranges(wrapper, x)
    assert _changed(wrapper.get_weights(), equalized.get_weights())
    np.testing.assert_allclose(equalized(x), wrapper(x), atol=2e-5)


def test_a_model_it_cannot_walk_is_returned_as_it_is():
    # A Sequential model has no graph of operations to walk; a Lambda would not be copied.
    x = np.random.default_rng(6).normal(size=(4, 5, 5, 4)).astype("float32")
    sequential = keras.Sequential(
        [
            keras.Input((5, 5, 4)),
            keras.layers.BatchNormalization(),
            keras.layers.Conv2D(3, 1),
        ]
    )
    inputs = keras.Input((5, 5, 4))
    with_lambda = keras.Model(
        inputs, keras.layers.Conv2D(3, 1)(keras.layers.Lambda(lambda t: t * 2)(inputs))
    )
    for model in (sequential, with_lambda):
        assert equalize_ranges(model, x) is model
