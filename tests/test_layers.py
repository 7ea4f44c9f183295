"""Tests of RelaxedShuffle, ChannelShuffle and the model helpers."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import edit_keras_file
from keras import layers, ops

from keras_autoshuffle import (
    ChannelShuffle,
    RelaxedShuffle,
    group_shuffle_permutation,
    relaxed_shuffles,
    shuffle_layers,
    total_l12_penalty,
)
from keras_autoshuffle.training import cpu_mirrored_strategy


def _numpy_penalty(m):
    m = np.asarray(m, dtype=np.float64)
    rows = np.abs(m).sum(axis=1) - np.sqrt((m**2).sum(axis=1))
    cols = np.abs(m).sum(axis=0) - np.sqrt((m**2).sum(axis=0))
    return rows.sum() + cols.sum()


def _matrix(layer):
    return ops.convert_to_numpy(layer.matrix)


def _small_model(penalty=1e-2, channels=6, data_format="channels_last", seed=0):
    shape = (4, 4, 3) if data_format == "channels_last" else (3, 4, 4)
    inputs = keras.Input(shape)
    if data_format == "channels_last":
        x = layers.Conv2D(channels, 1, use_bias=False, name="conv")(inputs)
    else:
        # The same 1x1 convolution as a per-pixel matmul: TensorFlow's CPU Conv2D kernel
        # runs channels_first only with oneDNN (CPUs with AVX-512), the shuffle everywhere.
        x = layers.EinsumDense("bchw,cd->bdhw", (channels, 4, 4), name="conv")(inputs)
    x = RelaxedShuffle(penalty=penalty, data_format=data_format, seed=seed, name="shuffle")(x)
    x = layers.GlobalAveragePooling2D(data_format=data_format)(x)
    outputs = layers.Dense(3, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs)


def _data(n=16, data_format="channels_last", seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 4, 4, 3) if data_format == "channels_last" else (n, 3, 4, 4)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 3, n)


# --- RelaxedShuffle, relaxed -------------------------------------------------------


def test_forward_channels_last_is_x_times_m_transpose():
    layer = RelaxedShuffle(seed=3)
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 7)).astype("float32")
    y = ops.convert_to_numpy(layer(x))
    m = _matrix(layer)
    np.testing.assert_allclose(y, x @ m.T, rtol=1e-5, atol=1e-6)


def test_forward_channels_first():
    layer = RelaxedShuffle(seed=3, data_format="channels_first")
    x = np.random.default_rng(0).normal(size=(2, 7, 5, 4)).astype("float32")
    y = ops.convert_to_numpy(layer(x))
    m = _matrix(layer)
    expected = np.moveaxis(np.moveaxis(x, 1, -1) @ m.T, -1, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_forward_on_rank_2_and_3_inputs():
    layer = RelaxedShuffle(seed=1)
    x = np.random.default_rng(1).normal(size=(3, 5, 6)).astype("float32")
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(x)), x @ _matrix(layer).T, rtol=1e-5, atol=1e-6
    )


def test_initial_matrix_is_projected_abs_gaussian():
    layer = RelaxedShuffle(seed=11, sinkhorn_iterations=1)  # Algorithm 1: one pass
    layer.build((None, 9))
    m = _matrix(layer)
    assert m.dtype == np.float32 and m.shape == (9, 9)
    assert np.all(m >= 0)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)  # rows are divided last
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=0.3)  # one pass: columns close
    # Independent: |N(0, 1)| with the same seed, then clip -> columns -> rows in NumPy.
    sample = np.abs(ops.convert_to_numpy(keras.random.normal((9, 9), seed=11)))
    sample = sample / sample.sum(axis=0, keepdims=True)
    np.testing.assert_allclose(m, sample / sample.sum(axis=1, keepdims=True), rtol=1e-5)


def test_penalty_reaches_layer_losses():
    layer = RelaxedShuffle(penalty=0.3, seed=2)
    layer(np.ones((1, 8), dtype="float32"))
    assert len(layer.losses) == 1
    expected = 0.3 * _numpy_penalty(_matrix(layer))
    assert float(layer.losses[0]) == pytest.approx(expected, rel=1e-5)
    assert layer.l12_penalty() == pytest.approx(expected / 0.3, rel=1e-5)


def test_zero_penalty_adds_no_loss():
    layer = RelaxedShuffle(penalty=0, seed=2)
    layer(np.ones((1, 8), dtype="float32"))
    assert layer.losses == []
    assert layer.trainable_weights[0] is layer.matrix


def test_fit_step_trains_and_constrains_matrix():
    model = _small_model(penalty=1e-2)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    shuffle = model.get_layer("shuffle")
    before = _matrix(shuffle)
    x, y = _data()
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = _matrix(shuffle)
    assert np.isfinite(history.history["loss"][0])
    assert np.abs(after - before).max() > 1e-4
    assert np.all(after >= 0)
    np.testing.assert_allclose(after.sum(axis=1), 1.0, atol=1e-5)


def test_training_loss_includes_penalty():
    model = _small_model(penalty=5.0)
    model.compile(loss="sparse_categorical_crossentropy")
    x, y = _data()
    data_loss = keras.losses.SparseCategoricalCrossentropy()(y, model.predict(x, verbose=0))
    expected = float(data_loss) + 5.0 * _numpy_penalty(_matrix(model.get_layer("shuffle")))
    assert model.evaluate(x, y, batch_size=16, verbose=0) == pytest.approx(expected, rel=1e-4)


def test_jit_compiled_fit():
    model = _small_model()
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss="sparse_categorical_crossentropy",
        jit_compile=True,
    )
    before = _matrix(model.get_layer("shuffle"))
    x, y = _data()
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = _matrix(model.get_layer("shuffle"))
    assert np.isfinite(history.history["loss"][0])
    assert np.abs(after - before).max() > 1e-4
    np.testing.assert_allclose(after.sum(axis=1), 1.0, atol=1e-5)


def test_mixed_precision_keeps_matrix_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = _small_model(penalty=1e-2)
        shuffle = model.get_layer("shuffle")
        assert shuffle.compute_dtype == "bfloat16"
        assert shuffle.matrix.dtype == "float32"
        assert keras.backend.standardize_dtype(shuffle.losses[0].dtype) == "float32"
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
        x, y = _data()
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        assert shuffle.matrix.dtype == "float32"
        m = _matrix(shuffle)
        assert np.all(m >= 0)
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-5)
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.tensorflow_only(reason="tf.distribute.MirroredStrategy")
def test_mirrored_strategy_matches_one_device(two_cpus):
    x, y = _data(n=16)

    def train(strategy):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = _small_model(penalty=1e-2, seed=5)
            model.compile(
                optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy"
            )
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    single = train(tf.distribute.OneDeviceStrategy(two_cpus[0]))
    mirrored_strategy = cpu_mirrored_strategy(two_cpus)
    assert mirrored_strategy.num_replicas_in_sync == 2
    mirrored = train(mirrored_strategy)
    keras.utils.set_random_seed(7)
    initial = _small_model(penalty=1e-2, seed=5).get_weights()
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(initial, single, strict=True))
    for a, b in zip(single, mirrored, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


# --- RelaxedShuffle, hardened ------------------------------------------------------


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_hardened_output_is_a_gather(data_format):
    layer = RelaxedShuffle(seed=4, data_format=data_format)
    x = np.random.default_rng(0).normal(size=(2, 6, 3, 3)).astype("float32")
    if data_format == "channels_last":
        x = np.moveaxis(x, 1, -1)
    layer(x)
    perm = layer.harden(permutation=[5, 3, 1, 0, 2, 4])
    assert layer.is_hardened
    np.testing.assert_array_equal(layer.permutation, [5, 3, 1, 0, 2, 4])
    y = ops.convert_to_numpy(layer(x))
    expected = x[..., perm] if data_format == "channels_last" else x[:, perm]
    np.testing.assert_array_equal(y, expected)
    assert layer.trainable_weights == [] and layer.weights == [] and layer.losses == []


def test_harden_picks_nearest_permutation():
    layer = RelaxedShuffle(penalty=1.0, seed=0)
    layer.build((None, 4))
    target = np.array([2, 0, 3, 1])
    near = 0.85 * np.eye(4)[target] + 0.05  # rows and columns sum to 1
    layer.matrix.assign(near)
    assert layer.l12_penalty() == pytest.approx(_numpy_penalty(near), rel=1e-5)
    np.testing.assert_array_equal(layer.harden(), target)
    assert layer.l12_penalty() == 0.0
    assert layer.matrix is None


def test_harden_twice_raises():
    layer = RelaxedShuffle()
    layer.build((None, 3))
    layer.harden()
    with pytest.raises(ValueError, match="already hardened"):
        layer.harden()


def test_harden_before_build_raises():
    with pytest.raises(ValueError, match="built"):
        RelaxedShuffle().harden()


def test_harden_with_wrong_permutation_raises():
    layer = RelaxedShuffle()
    layer.build((None, 3))
    with pytest.raises(ValueError, match="permutation"):
        layer.harden(permutation=[0, 1])
    with pytest.raises(ValueError, match="permutation"):
        layer.harden(permutation=[0, 0, 1])
    assert not layer.is_hardened


def test_hardened_model_trains_other_weights():
    model = _small_model()
    model.get_layer("shuffle").harden()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    assert len(model.trainable_weights) == 3  # conv kernel, dense kernel and bias
    assert model.losses == []
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.parametrize("harden", [False, True])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_keras_round_trip_safe_mode(tmp_path, harden, data_format):
    model = _small_model(data_format=data_format)
    if harden:
        model.get_layer("shuffle").harden()
    x, _ = _data(n=4, data_format=data_format)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    layer = restored.get_layer("shuffle")
    assert isinstance(layer, RelaxedShuffle)
    assert layer.is_hardened == harden
    assert layer.data_format == data_format
    if harden:
        np.testing.assert_array_equal(layer.permutation, model.get_layer("shuffle").permutation)
    else:
        assert layer.penalty == 1e-2 and len(restored.losses) == 1
        np.testing.assert_array_equal(_matrix(layer), _matrix(model.get_layer("shuffle")))
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"penalty": -1.0}, "Received: penalty=-1.0"),
        ({"penalty": "big"}, "Received: penalty=.big."),
        ({"sinkhorn_iterations": 0}, "sinkhorn_iterations"),
        ({"sinkhorn_iterations": 2.5}, "sinkhorn_iterations"),
        ({"data_format": "NHWC"}, "data_format"),
        ({"permutation": [0, 2]}, "permutation"),
    ],
)
def test_bad_arguments_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        RelaxedShuffle(**kwargs)


def test_permutation_size_checked_at_build():
    with pytest.raises(ValueError, match="permutation"):
        RelaxedShuffle(permutation=[1, 0, 2])(np.ones((1, 4), dtype="float32"))


def test_unknown_channels_raise():
    with pytest.raises(ValueError, match="channel"):
        RelaxedShuffle().build((None, 4, None))


# --- ChannelShuffle ----------------------------------------------------------------


def _numpy_classic_shuffle(x, groups):
    """ShuffleNet's shuffle as usually written: a 5-D reshape and transpose (NHWC)."""
    n, h, w, c = x.shape
    x = x.reshape(n, h, w, groups, c // groups).transpose(0, 1, 2, 4, 3)
    return x.reshape(n, h, w, c)


@pytest.mark.parametrize(("channels", "groups"), [(12, 3), (12, 4), (16, 8), (6, 1)])
def test_channel_shuffle_channels_last(channels, groups):
    x = np.random.default_rng(0).normal(size=(2, 3, 5, channels)).astype("float32")
    layer = ChannelShuffle(groups)
    y = ops.convert_to_numpy(layer(x))
    np.testing.assert_array_equal(y, _numpy_classic_shuffle(x, groups))
    np.testing.assert_array_equal(y, x[..., group_shuffle_permutation(channels, groups)])
    np.testing.assert_array_equal(layer.permutation, group_shuffle_permutation(channels, groups))


def test_channel_shuffle_channels_first():
    x = np.random.default_rng(1).normal(size=(2, 12, 3, 5)).astype("float32")
    y = ops.convert_to_numpy(ChannelShuffle(3, data_format="channels_first")(x))
    expected = np.moveaxis(_numpy_classic_shuffle(np.moveaxis(x, 1, -1), 3), -1, 1)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(y, x[:, group_shuffle_permutation(12, 3)])


def test_channel_shuffle_in_a_functional_model_with_unknown_batch(tmp_path):
    inputs = keras.Input((4, 4, 6))
    model = keras.Model(inputs, ChannelShuffle(2, name="shuffle")(inputs))
    x = np.random.default_rng(2).normal(size=(3, 4, 4, 6)).astype("float32")
    np.testing.assert_array_equal(model.predict(x, verbose=0), _numpy_classic_shuffle(x, 2))
    model.save(tmp_path / "m.keras")
    restored = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    assert restored.get_layer("shuffle").groups == 2
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))


def test_channel_shuffle_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        ChannelShuffle(4)(np.ones((1, 2, 2, 6), dtype="float32"))
    with pytest.raises(ValueError, match="rank-4"):
        ChannelShuffle(2)(np.ones((1, 6), dtype="float32"))
    for groups in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="groups"):
            ChannelShuffle(groups)
    with pytest.raises(ValueError, match="data_format"):
        ChannelShuffle(2, data_format="NCHW")
    with pytest.raises(ValueError, match="built"):
        _ = ChannelShuffle(2).permutation


# --- model helpers -----------------------------------------------------------------


def test_model_helpers_find_nested_shuffles():
    inner_inputs = keras.Input((4, 4, 6))
    inner = keras.Model(
        inner_inputs, RelaxedShuffle(penalty=1.0, seed=1, name="inner")(inner_inputs)
    )
    inputs = keras.Input((4, 4, 6))
    x = RelaxedShuffle(penalty=1.0, seed=2, name="outer")(inputs)
    x = ChannelShuffle(3, name="fixed")(x)
    model = keras.Model(inputs, inner(x))
    assert [layer.name for layer in shuffle_layers(model)] == ["outer", "fixed", "inner"]
    assert [layer.name for layer in relaxed_shuffles(model)] == ["outer", "inner"]
    expected = sum(_numpy_penalty(_matrix(layer)) for layer in relaxed_shuffles(model))
    assert total_l12_penalty(model) == pytest.approx(expected, rel=1e-5)
    model.get_layer("outer").harden()
    assert [layer.name for layer in relaxed_shuffles(model)] == ["inner"]
    assert total_l12_penalty(model) == pytest.approx(
        _numpy_penalty(_matrix(inner.get_layer("inner"))), rel=1e-5
    )


# --- hostile inputs and tampered files ---------------------------------------------


@pytest.mark.parametrize("hardened", [False, True])
@pytest.mark.parametrize("channels", [12, 4])
def test_call_on_another_channel_count_raises(hardened, channels):
    # Before the check: hardened on 12 channels returned 6, on 4 a raw GatherV2 error;
    # relaxed, a raw MatMul error.
    layer = RelaxedShuffle(seed=0, name="shuffle")
    layer(np.ones((2, 6), dtype="float32"))
    if hardened:
        layer.harden()
    with pytest.raises(ValueError, match=rf"'shuffle' was built for 6 channels.*\(2, {channels}\)"):
        layer(np.ones((2, channels), dtype="float32"))


def test_relaxed_shuffle_refuses_integer_inputs():
    # The matrix cast to int32 is all zeros: the output was silently zero.
    layer = RelaxedShuffle(seed=0)
    layer(np.ones((2, 4), dtype="float32"))
    with pytest.raises(ValueError, match="floating-point inputs. Received: inputs.dtype=int32"):
        layer(np.ones((2, 4), dtype="int32"))
    hardened = RelaxedShuffle(permutation=[1, 0, 3, 2])  # a gather works on any dtype
    out = ops.convert_to_numpy(hardened(np.arange(8, dtype="int32").reshape(2, 4)))
    np.testing.assert_array_equal(out, [[1, 0, 3, 2], [5, 4, 7, 6]])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sinkhorn_iterations", 10**8, "at most 1000.*Received: sinkhorn_iterations=100000000"),
        ("penalty", 1e300, r"Received: penalty=1e\+300"),
        ("penalty", float("nan"), "Received: penalty=nan"),
    ],
)
def test_tampered_keras_file_is_refused_fast(tmp_path, key, value, message):
    # 1e8 constraint passes used to hang load_model: the initializer ran them all.
    import time

    path = tmp_path / "model.keras"
    _small_model().save(path)
    edit_keras_file(path, "shuffle", lambda config: config.update({key: value}))
    start = time.perf_counter()
    # Keras wraps the layer's ValueError into a TypeError that quotes it.
    with pytest.raises((TypeError, ValueError), match=message):
        keras.saving.load_model(path, safe_mode=True)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("iterations", [1001, 100_000_000])
def test_sinkhorn_iterations_are_bounded(iterations):
    with pytest.raises(ValueError, match=f"Received: sinkhorn_iterations={iterations}"):
        RelaxedShuffle(sinkhorn_iterations=iterations)


def test_penalty_is_capped():
    with pytest.raises(ValueError, match=r"Received: penalty=1e\+300"):
        RelaxedShuffle(penalty=1e300)
    assert RelaxedShuffle(penalty=1e30).penalty == 1e30


def test_relaxed_shuffle_can_start_at_the_manual_shuffle():
    x = np.random.default_rng(0).normal(size=(2, 3, 3, 12)).astype("float32")
    for groups in (1, 2, 3):
        start = RelaxedShuffle(shuffle_initializer="manual", groups=groups)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(start(x)),
            keras.ops.convert_to_numpy(ChannelShuffle(groups)(x)),
        )
        assert start.l12_penalty() == 0.0  # a permutation: the penalty's zero
        clone = RelaxedShuffle.from_config(start.get_config())
        assert (clone.shuffle_initializer, clone.groups) == ("manual", groups)
    with pytest.raises(ValueError, match="Received: groups=0"):
        RelaxedShuffle(shuffle_initializer="manual", groups=0)
    with pytest.raises(ValueError, match="groups=5"):
        RelaxedShuffle(shuffle_initializer="manual", groups=5)(x)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle_initializer": "manual"}, "shuffle_initializer='manual', groups=None"),
        ({"groups": 3}, "shuffle_initializer='random', groups=3"),
        ({"shuffle_initializer": "identity"}, "shuffle_initializer='identity'"),
    ],
)
def test_groups_go_with_the_manual_initializer_only(kwargs, message):
    with pytest.raises(ValueError, match="Received: " + re.escape(message)):
        RelaxedShuffle(**kwargs)


# --- names of an unreleased API (0.1.0 was never published): no aliases --------------


@pytest.mark.parametrize(("key", "value"), [("iterations", 3), ("initial_groups", 2)])
def test_former_keywords_get_keras_unrecognized_keyword_error(key, value):
    # `iterations` is `sinkhorn_iterations`, `initial_groups=g` is
    # `shuffle_initializer="manual", groups=g`.
    message = f"Unrecognized keyword arguments passed to RelaxedShuffle: {{'{key}': {value}}}"
    with pytest.raises(ValueError, match=re.escape(message)):
        RelaxedShuffle(**{key: value})


def test_keras_file_with_a_former_config_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "old.keras"
    _small_model().save(path)
    edit_keras_file(path, "shuffle", lambda config: config.update(iterations=4))
    # Keras wraps the layer's ValueError into a TypeError that quotes it.
    with pytest.raises(TypeError, match=re.escape("RelaxedShuffle: {'iterations': 4}")):
        keras.saving.load_model(path, safe_mode=True)


def test_the_forward_mode_reads_as_forward_pass():
    # `forward` is torch.nn.Module's call on the torch backend: the mode lives in
    # `forward_pass` on every backend; `forward` stays the keyword and config key.
    layer = RelaxedShuffle(forward="hard")
    assert layer.forward_pass == "hard" and layer.get_config()["forward"] == "hard"
    assert callable(layer.forward) if keras.backend.backend() == "torch" else True
    for name in ("iterations", "initial_groups"):
        assert not hasattr(layer, name)


def test_numpy_numbers_are_accepted_where_numbers_are_asked_for():
    from keras_autoshuffle import ChannelSlice, DoublyStochastic, HardenShuffles
    from keras_autoshuffle.optimizers import CoupledSGD

    i = np.int64
    layer = ChannelSlice(i(1), i(3))
    assert json.dumps(layer.get_config())  # plain ints in the config
    x = np.arange(8, dtype="float32").reshape(1, 1, 2, 4)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), x[..., 1:3])
    assert json.dumps(CoupledSGD(l2=np.float32(1e-4)).get_config())
    assert (
        RelaxedShuffle(sinkhorn_iterations=i(2), penalty=np.float32(0.5)).sinkhorn_iterations == 2
    )
    assert DoublyStochastic(i(3)).get_config() == {"sinkhorn_iterations": 3}
    assert HardenShuffles(at_epoch=i(2)).at_epoch == 2
    with pytest.raises(ValueError, match="Received: start=np.True_"):
        ChannelSlice(np.bool_(True), 3)
