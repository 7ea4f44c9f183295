"""Helpers shared by the tests: tiny ShuffleNets, model checks for folding and hardening,
tiny IDX files, edited `.keras` files."""

import functools
import gzip
import importlib.util
import inspect
import itertools
import json
import os
import zipfile

import keras
import numpy as np
import pytest

import keras_autoshuffle as ka
from keras_autoshuffle import folding
from keras_autoshuffle._keras_internals import build_before_fit
from keras_autoshuffle.applications import (
    AutoShuffleNetV1,
    AutoShuffleNetV2,
    shufflenet_v1,
    shufflenet_v2,
)
from keras_autoshuffle.export import onnx_runtimes

# Tiny nets: the real layer structure (every layer kind, a down-sampling unit in every
# stage and basic units after it in stage 3), a few channels, 16x16 inputs (the CIFAR stem).
# For tests of structure (builders, hardening, folding, export, training loops), where
# the size of the published nets is not the point.
TINY_SIDE = 16
TINY_SHAPE = (TINY_SIDE, TINY_SIDE, 3)
TINY_REPEATS = (1, 3, 1)
TINY_UNITS = sum(TINY_REPEATS)
# v2: stem, stages 2-4 (even), head.
TINY_V2_CHANNELS = (8, 16, 32, 64, 64)
# v1: stem, stages 2-4, each stage a multiple of 4 x groups (the stem: of groups). As in
# the real 0.25x and 0.5x nets, the bottlenecks (stage // 4) hold an odd number of
# channels per group in stages 2 and 3 (g3: 9 = 3 x 3, 15 = 3 x 5).
TINY_V1_CHANNELS = {
    1: (6, 36, 60, 120),
    2: (8, 40, 80, 160),
    3: (6, 36, 60, 120),
    4: (8, 48, 80, 160),
    8: (8, 96, 160, 320),
}


def needs_extra(extra):
    """A skip mark for tests of a runtime extra ("onnx", "openvino") not installed."""
    missing = any(importlib.util.find_spec(m) is None for m in onnx_runtimes.MODULES[extra])
    return pytest.mark.skipif(
        missing, reason=f"needs the {extra} extra (pip install 'keras-autoshuffle[{extra}]')"
    )


def _public_defaults(builder):
    """The learned builder's defaults (every argument), with manual shuffles."""
    parameters = inspect.signature(builder).parameters.items()
    return {**{name: p.default for name, p in parameters}, "shuffle": "manual"}


def _tiny_arguments(builder, overrides):
    arguments = {**_public_defaults(builder), "input_shape": TINY_SHAPE, **overrides}
    if "input_tensor" in overrides and "input_shape" not in overrides:
        arguments["input_shape"] = None
    arguments.setdefault("repeats", TINY_REPEATS)
    return arguments


def tiny_v2(**overrides):
    """A tiny ShuffleNet v2 (manual shuffles unless `shuffle="auto"`): the public
    builders' defaults, 16x16x3 inputs, `TINY_V2_CHANNELS`, `TINY_REPEATS` units; any
    builder argument (or `channels`, `repeats`) overrides them."""
    arguments = _tiny_arguments(AutoShuffleNetV2, overrides)
    arguments.setdefault("channels", TINY_V2_CHANNELS)
    return shufflenet_v2._shufflenet_v2(**arguments)


def tiny_v1(**overrides):
    """A tiny ShuffleNet v1 (g = 3 and manual shuffles unless overridden), as `tiny_v2`;
    its channels are `TINY_V1_CHANNELS[groups]`."""
    arguments = _tiny_arguments(AutoShuffleNetV1, overrides)
    arguments.setdefault("channels", TINY_V1_CHANNELS[arguments["groups"]])
    return shufflenet_v1._shufflenet_v1(**arguments)


def fit(model, x, y, **arguments):
    """`model.fit(x, y, ...)` with the compiled state built first, as the package's
    training loop does (`_keras_internals.build_before_fit`): TensorFlow's trainer
    otherwise creates it in the train step's first trace and traces the step twice (a
    tiny v2's first fit, 14.6-16.1 s against 6.3-7.7 s here)."""
    build_before_fit(model, (x[:1], y[:1]))
    return model.fit(x, y, **arguments)


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


def edit_keras_file(path, layer_name, edit):
    """Rewrites config.json inside the `.keras` zip at `path`: `edit(config)` on the config
    of the layer `layer_name` (tampered files; files written with older config keys)."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    for layer in config["config"]["layers"]:
        if layer["config"]["name"] == layer_name:
            edit(layer["config"])
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _brute_force_best(matrix, keep):
    """Max matched mass over all permutations with keep(perm) True."""
    n = matrix.shape[0]
    masses = [
        matrix[np.arange(n), perm].sum()
        for perm in map(np.asarray, itertools.permutations(range(n)))
        if keep(perm)
    ]
    return max(masses) if masses else None


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def load_script(name):
    """scripts/<name>.py as a module (the scripts are not a package): its `main(argv)` runs
    in the test process, without a fresh interpreter's imports."""
    spec = importlib.util.spec_from_file_location(
        f"script_{name}", os.path.join(SCRIPTS, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_tiny_builders(monkeypatch, repeats=(1, 1, 1)):
    """For one test (or a module's fixture, with `pytest.MonkeyPatch.context()`),
    `keras_autoshuffle.applications.ShuffleNetV1/V2` and `AutoShuffleNetV1/V2` (the
    builders the training command line's model functions, the scripts and the experiments
    call, by width) build `tiny_v1` / `tiny_v2` with `repeats` units per stage: trainings
    set up by width (the reproduction, the study, the training scripts) run on tiny nets in
    this process. Processes started by the test build the real nets.

    One unit per stage by default: a training's time is mostly tracing, layer by layer.
    A unit after the first of a stage is a basic unit (v2: its channel split), e.g.
    `repeats=(1, 2, 1)`."""
    from keras_autoshuffle import applications

    for family, tiny in (("V1", tiny_v1), ("V2", tiny_v2)):
        monkeypatch.setattr(
            applications, f"ShuffleNet{family}", functools.partial(tiny, repeats=repeats)
        )
        learned = functools.partial(tiny, repeats=repeats, shuffle="auto")
        monkeypatch.setattr(applications, f"AutoShuffleNet{family}", learned)


def saved_form(cls, config):
    """How a `.keras` file stores an object of the package's registered class `cls` with
    `config` (e.g. a regularizer of a Dense layer), as `serialize_keras_object` writes it."""
    return {
        "module": cls.__module__,
        "class_name": cls.__name__,
        "config": config,
        "registered_name": f"keras_autoshuffle>{cls.__name__}",
    }


class Interrupt(keras.callbacks.Callback):
    """Stops the run at the start of epoch `epoch` (0-based), as a kill there would."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt("interrupted")
