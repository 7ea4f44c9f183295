"""Hardening and penalty logging inside `fit` on the current Keras backend.

Run by both CI test runs (TensorFlow, then `KERAS_BACKEND=jax`): Keras's JAX trainer holds
the weights outside the variables during `fit` and applies the optimizer statelessly to
the exact variable list it was built with, which hardening changes.
"""

import keras
import numpy as np
import pytest

import keras_autoshuffle as ka
from keras_autoshuffle.callbacks import HardenShuffles
from keras_autoshuffle.layers import total_l12_penalty


def _data(n=32):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4, 4, 6)).astype("float32"), rng.integers(0, 3, n)


def _model(optimizer=None):
    # Two convolutions of the same shape around the shuffle: a slot of the optimizer
    # paired with the wrong variable would not fail on shapes.
    model = keras.Sequential(
        [
            keras.Input((4, 4, 6)),
            keras.layers.Conv2D(6, 1),
            ka.RelaxedShuffle(penalty=1e-2, seed=1),
            keras.layers.Conv2D(6, 1),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


def _assert_changed(before, after):
    assert len(before) == len(after)
    assert all(np.all(np.isfinite(w)) for w in after)
    assert any(not np.allclose(b, a) for b, a in zip(before, after, strict=True))


def _assert_slots_follow_variables(model):
    # Each remaining variable keeps its own momentum (the optimizer indexes slots by
    # variable, and hardening removed the matrix from the middle of the list).
    optimizer = model.optimizer
    for variable in model.trainable_variables:
        slot = optimizer.momentums[optimizer._get_variable_index(variable)]
        assert slot.path.endswith(variable.path.replace("/", "_") + "_momentum")


class _Snapshot(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch] = _weights(self.model)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.Adam(1e-2, use_ema=True, ema_overwrite_frequency=3),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
    ],
    ids=["sgd", "adam_ema", "loss_scale"],
)
def test_harden_shuffles_mid_fit_then_training_goes_on(optimizer):
    x, y = _data()
    model = _model(optimizer())
    hardening, snapshot = HardenShuffles(at_epoch=1, verbose=0), _Snapshot()
    history = model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[hardening, snapshot])
    shuffle = model.layers[1]
    assert shuffle.is_hardened and hardening.report["epoch"] == 1
    assert shuffle.permutation.tolist() == hardening.report["layers"][0]["permutation"]
    assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))
    _assert_changed(snapshot.weights[0], _weights(model))
    assert np.all(np.isfinite(model.predict(x, verbose=0)))


def test_fit_again_after_harden_model_without_recompiling():
    x, y = _data()
    model = _model()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    slots = len(model.optimizer.variables)
    report = ka.harden_model(model)
    assert len(report) == 1 and model.layers[1].is_hardened
    before = _weights(model)
    history = model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    _assert_changed(before, _weights(model))
    # The optimizer's saved state keeps its layout (resuming from a backup relies on it).
    assert len(model.optimizer.variables) == slots
    _assert_slots_follow_variables(model)
    loss, _ = model.evaluate(x, y, verbose=0)
    assert np.isfinite(loss)


def test_harden_model_from_a_batch_callback():
    x, y = _data()
    model = _model()

    def harden(batch, logs):
        if batch == 1 and not model.layers[1].is_hardened:
            ka.harden_model(model)

    # LambdaCallback never touches `callback.model`, which would sync the JAX state.
    model.fit(
        x,
        y,
        epochs=2,
        batch_size=8,
        verbose=0,
        callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=harden)],
    )
    assert model.layers[1].is_hardened
    _assert_slots_follow_variables(model)
    assert np.all(np.isfinite(model.predict(x, verbose=0)))


def test_l12_penalty_from_callbacks_during_fit():
    x, y = _data()
    model = _model()
    shuffle = model.layers[1]
    batch_values, epoch_values, layer_errors = [], [], []

    def on_batch(batch, logs):
        try:  # first: total_l12_penalty attaches the JAX state to the variables
            shuffle.l12_penalty()
        except RuntimeError as error:  # JAX mid-epoch: the model holds the value
            layer_errors.append(str(error))
        batch_values.append(total_l12_penalty(model))

    def on_epoch(epoch, logs):
        epoch_values.append((shuffle.l12_penalty(), total_l12_penalty(model)))

    model.fit(
        x,
        y,
        epochs=2,
        batch_size=8,
        verbose=0,
        callbacks=[
            keras.callbacks.LambdaCallback(on_train_batch_end=on_batch, on_epoch_end=on_epoch)
        ],
    )
    assert len(batch_values) == 8 and len(epoch_values) == 2
    assert all(np.isfinite(v) and v > 0 for v in batch_values)
    for layer_value, total in epoch_values:
        assert layer_value == pytest.approx(total)
    # The penalty falls as training pushes M toward a permutation; the last batch's
    # value is the epoch's.
    assert batch_values[-1] < batch_values[0]
    assert epoch_values[-1][1] == pytest.approx(batch_values[-1])
    assert total_l12_penalty(model) == pytest.approx(shuffle.l12_penalty())
    if keras.backend.backend() == "jax":
        assert layer_errors and "jax_state_sync" in layer_errors[0]
    else:
        assert not layer_errors
