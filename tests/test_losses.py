"""`SmoothedSparseCrossentropy` against the label-smoothed cross-entropy computed by hand."""

import keras
import numpy as np
import pytest

from keras_autoshuffle.losses import SmoothedSparseCrossentropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_the_loss_is_the_cross_entropy_of_smoothed_targets(smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4))
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = np.array([0, 3, 1, 2, 2, 0])
    targets = np.full((6, 4), smoothing / 4) + (1 - smoothing) * np.eye(4)[labels]
    expected = np.mean(-np.sum(targets * np.log(probabilities), axis=-1))
    loss = SmoothedSparseCrossentropy(smoothing)(labels, probabilities.astype("float32"))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_the_loss_saves_and_loads_in_safe_mode():
    config = keras.saving.serialize_keras_object(SmoothedSparseCrossentropy(0.2))
    loaded = keras.saving.deserialize_keras_object(config, safe_mode=True)
    assert isinstance(loaded, SmoothedSparseCrossentropy) and loaded.label_smoothing == 0.2


@pytest.mark.parametrize("value", [1.0, -0.1, float("nan"), True, "0.1"])
def test_a_smoothing_outside_zero_to_one_is_refused_by_name(value):
    with pytest.raises(ValueError, match="label_smoothing"):
        SmoothedSparseCrossentropy(value)
