"""Helpers shared by the folding and hardening tests."""

import keras
import numpy as np

import keras_autoshuffle as ka
from keras_autoshuffle import folding


def _randomize_batch_norm(model, rng):
    """Non-trivial BN statistics, so a mis-permuted BN parameter shows in the outputs."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.get_weights()[0].size
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, n),
                    rng.normal(size=n) * 0.2,
                    rng.normal(size=n) * 0.2,
                    rng.uniform(0.5, 1.5, n),
                ]
            )


def _layer_counts(model):
    counts = {}
    for layer in model.layers:
        counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return counts


def _assert_folds_exactly(model, seed, side):
    rng = np.random.default_rng(seed)
    _randomize_batch_norm(model, rng)
    x = rng.normal(size=(2, side, side, 3)).astype("float32")
    folded = folding.fold_model(model)
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    got = keras.ops.convert_to_numpy(folded(x, training=False))
    scale = np.max(np.abs(expected))
    assert scale > 1e-2
    np.testing.assert_allclose(got, expected, atol=2e-5 * scale, rtol=0)
    assert folding.count_gathers(folded) == 0
    assert not any(isinstance(layer, ka.RelaxedShuffle) for layer in folded.layers)
    return folded
