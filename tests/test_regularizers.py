"""Tests of the l1-2 penalty, Eq. (1), and Theorem 1."""

import decimal
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import edit_keras_file, saved_form

from keras_autoshuffle import DoublyStochastic, L12Penalty, l12_penalty, permutation_matrix


def _numpy_penalty(m):
    """Eq. (1) written out independently: rows plus columns, l1 minus l2."""
    m = np.asarray(m, dtype=np.float64)
    total = 0.0
    for vector in list(m) + list(m.T):
        total += np.sum(np.abs(vector)) - np.sqrt(np.sum(vector**2))
    return total


def _sinkhorn(m, passes=500):
    for _ in range(passes):
        m = m / m.sum(axis=0, keepdims=True)
        m = m / m.sum(axis=1, keepdims=True)
    return m


def _penalty(m):
    return float(keras.ops.convert_to_numpy(l12_penalty(np.asarray(m, dtype="float32"))))


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_theorem1_zero_on_permutations(n):
    perm = np.random.default_rng(n).permutation(n)
    assert _penalty(permutation_matrix(perm)) == 0.0


def test_theorem1_positive_on_doubly_stochastic_non_permutations():
    rng = np.random.default_rng(0)
    candidates = [np.full((4, 4), 0.25), _sinkhorn(rng.random((5, 5)))]
    # Convex combinations of two permutations (Birkhoff polytope, off the vertices).
    for t in (0.01, 0.3, 0.5):
        candidates.append(t * permutation_matrix(rng.permutation(6)) + (1 - t) * np.eye(6))
    for m in candidates:
        assert np.allclose(m.sum(axis=0), 1) and np.allclose(m.sum(axis=1), 1)
        value = _penalty(m)
        assert value > 1e-3
        assert value == pytest.approx(_numpy_penalty(m), rel=1e-5)


def test_values_match_numpy():
    rng = np.random.default_rng(1)
    # Arbitrary matrices, negative entries included: the l1 terms use |m_ij|.
    for shape in [(3, 3), (7, 7), (4, 6)]:
        m = rng.normal(size=shape)
        assert _penalty(m) == pytest.approx(_numpy_penalty(m), rel=1e-5)
    # Q(q) = [[q, 1-q], [1-q, q]]: P = 4 (1 - sqrt(q^2 + (1-q)^2)) (paper, Section 3).
    for q in (0.0, 0.2, 0.5, 2 / 3, 1.0):
        m = np.array([[q, 1 - q], [1 - q, q]])
        assert _penalty(m) == pytest.approx(4 * (1 - np.sqrt(q**2 + (1 - q) ** 2)), abs=1e-6)


def test_penalty_is_float32_for_half_precision_input():
    m = np.random.default_rng(2).random((8, 8))
    value = l12_penalty(keras.ops.cast(m, "bfloat16"))
    assert keras.backend.standardize_dtype(value.dtype) == "float32"


@pytest.mark.parametrize(
    "m",
    [
        np.zeros((3, 3)),
        np.array([[0.0, 0.0, 0.0], [0.2, 0.5, 0.3], [0.8, 0.5, 0.7]]),  # a zero row
        np.array([[0.0, 0.4, 0.6], [0.0, 0.5, 0.5], [0.0, 0.1, 0.9]]),  # a zero column
        np.eye(3),  # one-hot rows and columns
        np.array([[1.0, 0.0, 0.0], [0.0, 0.3, 0.7], [0.0, 0.7, 0.3]]),  # one one-hot row
    ],
)
@pytest.mark.tensorflow_only(reason="tf.GradientTape")
def test_gradient_is_finite_at_zero_and_one_hot(m):
    variable = tf.Variable(m, dtype="float32")
    with tf.GradientTape() as tape:
        value = l12_penalty(variable)
    gradient = tape.gradient(value, variable).numpy()
    assert np.all(np.isfinite(gradient))
    assert np.isfinite(float(value))
    # Where every line through an entry is non-zero the gradient is the analytic one:
    # sign(m_ij) - m_ij / ||row_i|| + sign(m_ij) - m_ij / ||col_j||.
    rows = np.linalg.norm(m, axis=1, keepdims=True)
    cols = np.linalg.norm(m, axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        analytic = 2 * np.sign(m) - m / rows - m / cols
    defined = (rows > 0) & (cols > 0) & (m != 0)
    np.testing.assert_allclose(gradient[defined], analytic[defined], rtol=1e-5, atol=1e-6)


def test_l12_penalty_rejects_non_matrices():
    with pytest.raises(ValueError, match="shape"):
        l12_penalty(np.ones((2, 2, 2), dtype="float32"))


def test_regularizer_scales_penalty():
    m = np.random.default_rng(3).random((5, 5)).astype("float32")
    value = float(L12Penalty(0.25)(keras.ops.convert_to_tensor(m)))
    assert value == pytest.approx(0.25 * _numpy_penalty(m), rel=1e-5)


def test_regularizer_rank_check():
    with pytest.raises(ValueError, match="rank-2"):
        L12Penalty(1.0)(keras.ops.ones((3, 3, 3)))


@pytest.mark.parametrize("penalty", [-1e-3, float("nan"), float("inf"), "strong", None])
def test_regularizer_penalty_validation(penalty):
    with pytest.raises(ValueError, match="Received: penalty="):
        L12Penalty(penalty)


def test_regularizer_serialization():
    regularizer = L12Penalty(2e-3)
    config = keras.saving.serialize_keras_object(regularizer)
    assert config["registered_name"] == "keras_autoshuffle>L12Penalty"
    restored = keras.saving.deserialize_keras_object(config, safe_mode=True)
    assert isinstance(restored, L12Penalty)
    assert restored.get_config() == {"penalty": 2e-3}
    assert keras.regularizers.get(config).penalty == 2e-3


@pytest.mark.parametrize("scale", [1e20, 1e30, 1e-30, 1e-36])
def test_huge_and_tiny_matrices_give_the_scaled_value(scale):
    # P is positively homogeneous: P(cM) = c P(M). Squares of 1e20 overflow float32 and
    # those of 1e-30 underflow: -inf / NaN and wrong values before the scaling. (Below
    # 1.2e-38 float32 numbers are subnormal, which TF and XLA CPU kernels flush to 0.)
    m = np.random.default_rng(4).random((3, 3))
    expected = scale * _numpy_penalty(m)
    assert _penalty(m * scale) == pytest.approx(expected, rel=1e-5)
    assert _penalty(np.full((3, 3), scale)) == pytest.approx(scale * 6 * (3 - np.sqrt(3)), rel=1e-5)


def _exact_penalty(m):
    """Eq. (1) in 60-digit decimal arithmetic: no overflow or underflow at any float64 value
    (an independent check of the scaling)."""
    with decimal.localcontext() as context:
        context.prec = 60
        m = [[decimal.Decimal(float(v)) for v in row] for row in np.asarray(m)]
        lines = m + [list(column) for column in zip(*m, strict=True)]
        return float(
            sum(sum(abs(v) for v in line) - sum(v * v for v in line).sqrt() for line in lines)
        )


def _dtype_range_cases(dtype):
    """Matrices at the edges of `dtype`: near its maximum, near its smallest normal, mixed."""
    info = np.finfo(dtype)
    m = np.random.default_rng(5).random((4, 4))
    return {
        "max": np.full((3, 3), info.max),  # P = 6 (3 - sqrt 3) max: beyond the range
        "near max": (m / m.max() * info.max / 16),
        "half max, one entry": np.diag([info.max / 2, 0.0, 0.0]),
        "tiny": m * info.tiny * 64,
        "wide": np.array([[info.max / 8, 1.0], [1e-3, info.max / 8]]),
    }


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_norm_stays_finite_at_the_edges_of_the_dtype(dtype):
    # Every finite input gives P as a 60-digit computation does, to the dtype's precision:
    # +inf only where that value is beyond the dtype's range.
    if (
        keras.backend.standardize_dtype(keras.ops.convert_to_tensor(np.float64(1)).dtype) != dtype
        and dtype == "float64"
    ):
        pytest.skip("this backend runs without float64 (JAX without x64)")
    info = np.finfo(dtype)
    for label, m in _dtype_range_cases(dtype).items():
        m = m.astype(dtype)
        value = l12_penalty(m)
        assert keras.backend.standardize_dtype(value.dtype) == dtype, label
        value = float(keras.ops.convert_to_numpy(value))
        exact = _exact_penalty(m)
        if abs(exact) > info.max:
            assert value == np.inf, label
        else:
            # l1 - l2 cancels: the error is relative to the entries, not to P.
            error = 4 * m.size * float(info.eps) * float(np.max(np.abs(m)))
            assert np.isfinite(value), (label, value)
            assert value == pytest.approx(exact, rel=1e-5, abs=error), label
    # A permutation's zero stays zero at any scale.
    assert float(keras.ops.convert_to_numpy(l12_penalty(np.eye(4, dtype=dtype) * info.max))) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_entries_give_nan(bad):
    m = np.random.default_rng(6).random((3, 3))
    m[1, 2] = bad
    assert np.isnan(_penalty(m))


@pytest.mark.tensorflow_only(reason="tf.GradientTape")
def test_gradient_of_a_huge_matrix_is_the_analytic_one():
    variable = tf.Variable(np.full((3, 3), 1e20), dtype="float32")
    with tf.GradientTape() as tape:
        value = l12_penalty(variable)
    # 2 sign(m) - m / ||row|| - m / ||col|| = 2 - 2 / sqrt(3) for a constant matrix.
    expected = np.full((3, 3), 2 - 2 / np.sqrt(3))
    np.testing.assert_allclose(tape.gradient(value, variable).numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("penalty", [1e300, 1e31])
def test_regularizer_penalty_is_capped(penalty):
    with pytest.raises(ValueError, match=re.escape(f"Received: penalty={penalty}")):
        L12Penalty(penalty)
    assert L12Penalty(1e30).penalty == 1e30


# --- the name of an unreleased API (`strength`, now `penalty`): no alias -------------


def test_former_keyword_strength_is_an_unexpected_keyword():
    with pytest.raises(TypeError, match="unexpected keyword argument 'strength'"):
        L12Penalty(strength=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lam'"):
        L12Penalty(lam=1.0)
    config = saved_form(L12Penalty, {"strength": 2e-3})
    with pytest.raises(TypeError, match="unexpected keyword argument 'strength'"):
        keras.saving.deserialize_keras_object(config, safe_mode=True)


def _dense_model():
    """A Dense layer regularized and constrained by the package's objects."""
    inputs = keras.Input((4,))
    dense = keras.layers.Dense(
        4,
        kernel_regularizer=L12Penalty(0.5),
        kernel_constraint=DoublyStochastic(3),
        name="dense",
    )
    return keras.Model(inputs, dense(inputs))


def test_keras_file_with_the_package_regularizer_and_constraint_loads_in_safe_mode(tmp_path):
    model = _dense_model()
    path = tmp_path / "dense.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    layer = restored.get_layer("dense")
    assert layer.kernel_regularizer.penalty == 0.5
    assert layer.kernel_constraint.sinkhorn_iterations == 3
    x = np.random.default_rng(7).normal(size=(2, 4)).astype("float32")
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))
    np.testing.assert_allclose(
        [float(loss) for loss in restored.losses], [float(loss) for loss in model.losses]
    )


def test_keras_file_with_a_former_config_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "old.keras"
    _dense_model().save(path)
    edit_keras_file(
        path, "dense", lambda config: config["kernel_regularizer"].update(config={"strength": 0.5})
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'strength'"):
        keras.saving.load_model(path, safe_mode=True)
