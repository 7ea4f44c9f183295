"""`.keras` files written by an older keras_autoshuffle load with `safe_mode=True` and compute
what they computed when written (issue 41, item 3: keep today's files loading).

The files in `fixtures/old_keras/` were written at commit fc2abd0, before the builders were
split and `applications` was regrouped (modules moved, registered names kept), by

    git worktree add runs/old fc2abd0
    PYTHONPATH=runs/old python scripts/make_old_keras_fixtures.py --output tests/fixtures/old_keras

with Keras 3.15.1 on TensorFlow: each net's `.keras` file, a seeded input and the net's
outputs on it, computed by that code.
"""

import os

import keras
import numpy as np
import pytest

import keras_autoshuffle  # noqa: F401 (registers the custom objects)
from keras_autoshuffle.applications import ResizeCenterCrop
from keras_autoshuffle.applications.preprocessing import ToRGB
from keras_autoshuffle.layers import ChannelShuffle, GroupedConv2D, RelaxedShuffle

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "old_keras")
# Each file and the package's registered layer classes it holds.
FILES = {
    "v2_relaxed": (RelaxedShuffle,),
    "v1_manual": (ChannelShuffle, GroupedConv2D),
    "preprocessing": (ToRGB, ResizeCenterCrop),
}


def _fixture(name):
    return os.path.join(FIXTURES, name)


@pytest.mark.parametrize("name", sorted(FILES))
def test_an_old_keras_file_loads_safely_and_computes_what_it_did(name):
    model = keras.saving.load_model(_fixture(f"{name}.keras"), safe_mode=True)
    for cls in FILES[name]:
        assert any(type(layer) is cls for layer in model.layers), cls.__name__
    x = np.load(_fixture(f"{name}_input.npy"))
    expected = np.load(_fixture(f"{name}_output.npy"))
    # The inputs' outputs differ far more than the tolerance: a net that lost a weight or
    # a shuffle's routing would not pass.
    assert np.ptp(expected, axis=0).max() > 1.0
    actual = keras.ops.convert_to_numpy(model(x, training=False))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
