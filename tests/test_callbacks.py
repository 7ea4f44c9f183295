"""Tests of HardenShuffles, ShufflePenaltyLogger and harden_model on crafted models."""

import csv

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers, ops

from keras_autoshuffle import (
    HardenShuffles,
    RelaxedShuffle,
    ShufflePenaltyLogger,
    format_hardening_report,
    harden_model,
    permutation_matrix,
)

TARGET = np.array([2, 0, 3, 1])
# 0.4 P + 0.15: exactly doubly stochastic, nearest permutation TARGET, clearly not a
# permutation, so rounding changes the model's outputs.
NEAR = 0.4 * permutation_matrix(TARGET) + 0.15


def _numpy_penalty(m):
    m = np.asarray(m, dtype=np.float64)
    rows = np.abs(m).sum(axis=1) - np.sqrt((m**2).sum(axis=1))
    cols = np.abs(m).sum(axis=0) - np.sqrt((m**2).sum(axis=0))
    return rows.sum() + cols.sum()


def _crafted_model(penalty=1e-2):
    inputs = keras.Input((4,))
    x = layers.Dense(4, name="features")(inputs)
    # Algorithm 1's one pass per step: the steps the thresholds below were set for.
    x = RelaxedShuffle(penalty=penalty, sinkhorn_iterations=1, seed=0, name="shuffle")(x)
    outputs = layers.Dense(3, activation="softmax", name="head")(x)
    model = keras.Model(inputs, outputs)
    model.get_layer("shuffle").matrix.assign(NEAR)
    return model


class _Recorder(keras.callbacks.Callback):
    """Records the shuffle matrix, the permutation and accuracy at the hooks it sees."""

    def __init__(self, validation_data=None):
        super().__init__()
        self.validation_data = validation_data
        self.matrices, self.permutations, self.weights = [], [], []
        self.accuracy = None

    def on_epoch_end(self, epoch, logs=None):
        layer = self.model.get_layer("shuffle")
        self.matrices.append(None if layer.is_hardened else ops.convert_to_numpy(layer.matrix))
        self.permutations.append(layer.permutation)
        self.weights.append([ops.convert_to_numpy(w) for w in self.model.weights])

    def on_train_end(self, logs=None):
        layer = self.model.get_layer("shuffle")
        if not layer.is_hardened:
            self.matrices.append(ops.convert_to_numpy(layer.matrix))
        if self.validation_data is not None:
            x, y = self.validation_data
            self.accuracy = self.model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]


def test_report_figures_at_end_of_training():
    model = _crafted_model()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    # Labels are the relaxed model's own predictions: relaxed accuracy 1, rounding hurts.
    y = np.argmax(model.predict(x, verbose=0), axis=1)
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    recorder = _Recorder(validation_data=(x, y))
    harden = HardenShuffles(validation_data=(x, y), verbose=0)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[recorder, harden])

    matrix = recorder.matrices[-1]  # the matrix just before rounding
    np.testing.assert_allclose(matrix, NEAR, atol=1e-6)
    layer = model.get_layer("shuffle")
    assert layer.is_hardened
    np.testing.assert_array_equal(layer.permutation, TARGET)

    report = harden.report
    assert report["epoch"] is None
    (entry,) = report["layers"]
    assert entry["name"] == "shuffle" and entry["channels"] == 4
    assert entry["permutation"] == TARGET.tolist()
    assert entry["argmax_agrees"] is True
    assert entry["l12_penalty"] == pytest.approx(_numpy_penalty(matrix), rel=1e-5)
    assert entry["distance"] == pytest.approx(
        np.linalg.norm(matrix - permutation_matrix(TARGET)), rel=1e-5
    )

    relaxed = recorder.accuracy
    rounded = model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]
    assert relaxed == 1.0 and rounded < 1.0
    assert report["relaxed_accuracy"] == pytest.approx(relaxed)
    assert report["rounded_accuracy"] == pytest.approx(rounded)
    assert report["relative_change"] == pytest.approx((rounded - relaxed) / relaxed)
    text = format_hardening_report(report)
    assert "Hardened 1 shuffles at the end of training" in text
    assert "relative change" in text


def test_training_continues_with_fixed_permutation_after_at_epoch():
    model = _crafted_model()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.integers(0, 3, 64)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    harden = HardenShuffles(
        validation_data=tf.data.Dataset.from_tensor_slices((x, y)).batch(32), at_epoch=1, verbose=0
    )
    recorder = _Recorder()  # after HardenShuffles: sees the state once epoch 1 is hardened
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[harden, recorder])

    assert harden.report["epoch"] == 1
    assert "relative_change" in harden.report
    layer = model.get_layer("shuffle")
    assert layer.is_hardened and layer.weights == []
    # The permutation chosen after epoch 1 stays fixed in epochs 2 and 3 ...
    assert len(recorder.permutations) == 3
    for perm in recorder.permutations:
        np.testing.assert_array_equal(perm, harden.report["layers"][0]["permutation"])
    # ... while the other weights keep training.
    for before, after in zip(recorder.weights[0], recorder.weights[2], strict=True):
        assert np.abs(after - before).max() > 1e-6
    for before, after in zip(recorder.weights[1], recorder.weights[2], strict=True):
        assert np.abs(after - before).max() > 1e-6
    assert all(np.isfinite(history.history["loss"]))


def test_l12_penalty_in_history_and_csv(tmp_path):
    model = _crafted_model(penalty=0.5)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = rng.integers(0, 3, 32)
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="sparse_categorical_crossentropy")
    recorder = _Recorder()
    path = tmp_path / "log.csv"
    history = model.fit(
        x,
        y,
        epochs=3,
        batch_size=16,
        verbose=0,
        callbacks=[recorder, ShufflePenaltyLogger(), keras.callbacks.CSVLogger(str(path))],
    )
    logged = history.history["l12_penalty"]
    expected = [_numpy_penalty(m) for m in recorder.matrices[:3]]
    np.testing.assert_allclose(logged, expected, rtol=1e-5)
    # lambda = 0.5 pushes M from NEAR (P = 3.14) toward the permutation.
    assert max(logged) < 0.1 * _numpy_penalty(NEAR)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    np.testing.assert_allclose([float(r["l12_penalty"]) for r in rows], logged, rtol=1e-5)


def test_harden_model_without_validation():
    model = _crafted_model()
    report = harden_model(model)
    assert [entry["permutation"] for entry in report] == [TARGET.tolist()]
    assert harden_model(model) == []  # nothing left to harden
    x = np.random.default_rng(3).normal(size=(5, 4)).astype("float32")
    features = ops.convert_to_numpy(model.get_layer("features")(x))
    head = model.get_layer("head")
    np.testing.assert_allclose(
        model.predict(x, verbose=0),
        ops.convert_to_numpy(head(features[:, TARGET])),
        rtol=1e-5,
        atol=1e-6,
    )


def test_no_validation_data_gives_layer_report_only():
    model = _crafted_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    harden = HardenShuffles(verbose=0)
    x = np.zeros((8, 4), dtype="float32")
    model.fit(x, np.zeros(8), epochs=1, verbose=0, callbacks=[harden])
    assert set(harden.report) == {"epoch", "layers"}
    assert model.get_layer("shuffle").is_hardened


def test_validation_needs_accuracy_metric():
    model = _crafted_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    x, y = np.zeros((8, 4), dtype="float32"), np.zeros(8)
    with pytest.raises(ValueError, match="accuracy"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[HardenShuffles((x, y), verbose=0)])


@pytest.mark.parametrize("at_epoch", [0, -1, 1.5, True, "2"])
def test_bad_at_epoch(at_epoch):
    with pytest.raises(ValueError, match="at_epoch"):
        HardenShuffles(at_epoch=at_epoch)


def test_at_epoch_after_the_last_epoch_warns_and_hardens_at_the_end():
    model = _crafted_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    harden = HardenShuffles(at_epoch=5, verbose=0)
    x = np.zeros((8, 4), dtype="float32")
    with pytest.warns(UserWarning, match=r"at_epoch=5\) comes after the last epoch.*epochs=2"):
        model.fit(x, np.zeros(8), epochs=2, verbose=0, callbacks=[harden])
    assert harden.report["epoch"] is None and model.get_layer("shuffle").is_hardened


_X, _Y = np.zeros((8, 4), dtype="float32"), np.zeros(8)


@pytest.mark.parametrize(
    ("validation_data", "message"),
    [
        (_X, "not x alone.*Received: validation_data of type ndarray"),
        ([_X, _Y], "Received: validation_data of type list"),
        ((_X, _Y, None, None), "Received: a tuple of 4 items"),
        ((_X,), "Received: a tuple of 1 items"),
        ((_X[:0], _Y[:0]), r"holds no examples. Received: first dimensions \[0, 0\]"),
        ((_X, _Y[:5]), r"same number of examples. Received: first dimensions \[8, 5\]"),
        (tf.data.Dataset.from_tensor_slices((_X, _Y)).batch(4).take(0), "holds no batches"),
        ((batch for batch in [(_X, _Y)]), "generator or iterator would be used up"),
        (42, "Received: validation_data of type int"),
    ],
    ids="x_only list 4_tuple 1_tuple empty unequal empty_dataset generator int".split(),
)
def test_malformed_validation_data_is_refused_up_front(validation_data, message):
    # Before: "None values not supported", a TypeError about verbose, or a claim that
    # the model lacks an accuracy metric, at the end of training.
    with pytest.raises(ValueError, match=message):
        HardenShuffles(validation_data=validation_data)


def test_well_formed_validation_data_is_accepted():
    dataset = tf.data.Dataset.from_tensor_slices((_X, _Y)).batch(4)
    for data in [(_X, _Y), (_X, _Y, np.ones(8)), (_X, _Y, None), ({"a": _X}, _Y), dataset]:
        assert HardenShuffles(validation_data=data).validation_data is data
