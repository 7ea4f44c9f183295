"""Write `.keras` files with an older keras_autoshuffle, for tests/test_old_keras_files.py.

Run with an older checkout's package first on the path (not this one), e.g. commit fc2abd0,
before the builders were split and `applications` was regrouped:

    git worktree add runs/old fc2abd0
    PYTHONPATH=runs/old python scripts/make_old_keras_fixtures.py --output tests/fixtures/old_keras

For each net it writes `<name>.keras`, the seeded input `<name>_input.npy` and the net's
outputs on it `<name>_output.npy` (float32, `training=False`). The nets are tiny (the
private builders' `channels` / `repeats`, a few KB each) with every layer kind the public
builders use:

- `v2_relaxed`: ShuffleNet v2, learned shuffles (`RelaxedShuffle`), ImageNet stem with
  PyTorch's padding, 32x32 inputs, 10 logits;
- `v1_manual`: ShuffleNet v1, g = 3, manual shuffles (`ChannelShuffle`, `GroupedConv2D`),
  CIFAR stem, 16x16 inputs, 10 logits;
- `preprocessing`: `applications.evaluation_preprocessing(16, 20)` (`ToRGB`,
  `ResizeCenterCrop`), images of 24x30 pixels.

The weights are seeded and spread (`_spread_weights`) so that every part of each net moves
its outputs.
"""

import argparse
import inspect
import json
import os
import subprocess

import keras
import numpy as np

import keras_autoshuffle
from keras_autoshuffle.applications import (
    AutoShuffleNetV2,
    evaluation_preprocessing,
    shufflenet_v1,
    shufflenet_v2,
)
from keras_autoshuffle.layers import RelaxedShuffle

SEED = 0


def _defaults(builder):
    return {name: p.default for name, p in inspect.signature(builder).parameters.items()}


def _spread_weights(model, rng):
    """Weights under which every part of the net moves the outputs: BatchNormalization
    statistics away from (0, 1), relaxed shuffles near a permutation (0.8 P + 0.2 / N:
    their random start is near the uniform matrix, which averages the channels and leaves
    the logits nearly equal for any input), convolutions He-normal (with Keras's default
    the signal died out before the v2 head) and a classifier of unit scale (N(0, 0.01) at
    the start: logits near 0)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.DepthwiseConv2D):  # feeds a BN only: linear gain
            (kernel,) = layer.get_weights()
            fan_in = kernel.shape[0] * kernel.shape[1]
            layer.set_weights([rng.normal(0, (1 / fan_in) ** 0.5, kernel.shape).astype("float32")])
        elif isinstance(layer, keras.layers.Conv2D):  # GroupedConv2D too; feeds BN + ReLU
            (kernel,) = layer.get_weights()
            fan_in = kernel.shape[0] * kernel.shape[1] * kernel.shape[2]
            layer.set_weights([rng.normal(0, (2 / fan_in) ** 0.5, kernel.shape).astype("float32")])
        elif isinstance(layer, RelaxedShuffle):
            (matrix,) = layer.get_weights()
            n = matrix.shape[0]
            mixed = 0.8 * np.eye(n)[rng.permutation(n)] + 0.2 / n
            layer.set_weights([mixed.astype("float32")])
        elif isinstance(layer, keras.layers.Dense):
            kernel, bias = layer.get_weights()
            layer.set_weights([rng.normal(size=kernel.shape).astype("float32"), bias])
        elif isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, gamma.shape).astype("float32"),
                    rng.normal(0.0, 0.1, beta.shape).astype("float32"),
                    rng.normal(0.0, 0.1, mean.shape).astype("float32"),
                    rng.uniform(0.5, 1.5, variance.shape).astype("float32"),
                ]
            )
    return model


def nets():
    """{name: (model, input)} built by the package on the path."""
    rng = np.random.default_rng(SEED)
    common = {**_defaults(AutoShuffleNetV2), "classes": 10, "classifier_activation": None}
    v2 = shufflenet_v2._shufflenet_v2(
        **{
            **common,
            "width": 0.5,
            "shuffle": "auto",
            "stem": "imagenet",
            "input_shape": (32, 32, 3),
        },
        channels=(8, 16, 32, 64, 64),
        repeats=(1, 3, 1),
    )
    v1 = shufflenet_v1._shufflenet_v1(
        **{
            **common,
            "width": 1.0,
            "groups": 3,
            "shuffle": "manual",
            "stem": "cifar",
            "input_shape": (16, 16, 3),
        },
        channels=(6, 36, 60, 120),
        repeats=(1, 3, 1),
    )
    images = rng.uniform(0, 255, (2, 24, 30, 3)).astype("float32")
    return {
        "v2_relaxed": (_spread_weights(v2, rng), rng.normal(size=(2, 32, 32, 3))),
        "v1_manual": (_spread_weights(v1, rng), rng.normal(size=(2, 16, 16, 3))),
        "preprocessing": (evaluation_preprocessing(16, 20), images),
    }


def _commit():
    folder = os.path.dirname(os.path.dirname(os.path.abspath(keras_autoshuffle.__file__)))
    result = subprocess.run(
        ["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() or "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the folder to write the files into")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    keras.utils.set_random_seed(SEED)
    for name, (model, x) in nets().items():
        x = np.asarray(x, "float32")
        model.save(os.path.join(args.output, f"{name}.keras"))
        np.save(os.path.join(args.output, f"{name}_input.npy"), x)
        output = keras.ops.convert_to_numpy(model(x, training=False))
        np.save(os.path.join(args.output, f"{name}_output.npy"), output.astype("float32"))
    source = {
        "keras_autoshuffle": keras_autoshuffle.__file__,
        "commit": _commit(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
    }
    print(json.dumps(source))


if __name__ == "__main__":
    main()
