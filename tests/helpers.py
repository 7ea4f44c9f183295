"""Helpers shared by the tests: model checks for folding and hardening, tiny IDX files."""

import gzip
import itertools
import os

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


def _write_idx(path, array, compress=False, magic=None):
    """An IDX file of uint8 `array`: magic 0x0000080<ndim>, big-endian dims, the bytes."""
    array = np.asarray(array, np.uint8)
    magic = 0x800 + array.ndim if magic is None else magic
    raw = magic.to_bytes(4, "big") + np.asarray(array.shape, ">u4").tobytes() + array.tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if compress else raw)
    return path


def _write_fashion(folder, num_train=20, num_test=10, seed=0):
    """Tiny Fashion-MNIST in `folder`: training files gzip-compressed, test files plain."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count, compress in (("train", num_train, True), ("t10k", num_test, False)):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = (np.arange(count) + seed) % 10
        suffix = ".gz" if compress else ""
        _write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images, compress)
        _write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", labels, compress)
        arrays[split] = (images, labels)
    return arrays


def _brute_force_best(matrix, keep):
    """Max matched mass over all permutations with keep(perm) True."""
    n = matrix.shape[0]
    masses = [
        matrix[np.arange(n), perm].sum()
        for perm in map(np.asarray, itertools.permutations(range(n)))
        if keep(perm)
    ]
    return max(masses) if masses else None
