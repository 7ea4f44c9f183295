"""Tests of the DoublyStochastic constraint (Algorithm 1, steps 4-6)."""

import fractions

import keras
import numpy as np
import pytest
from helpers import saved_form

from keras_autoshuffle import DoublyStochastic


def _numpy_pass(m):
    """One pass of Algorithm 1 in NumPy: clip at 0, columns, then rows."""
    m = np.maximum(m, 0.0)
    m = m / m.sum(axis=0, keepdims=True)
    return m / m.sum(axis=1, keepdims=True)


def _apply(constraint, m):
    return keras.ops.convert_to_numpy(constraint(np.asarray(m, dtype="float32")))


def _as_traced(constraint):
    """The constraint as training applies it, inside a traced function (TensorFlow: one
    graph for the 400 calls of a loop below, instead of 400 x its ops run one by one)."""
    if keras.backend.backend() != "tensorflow":
        return constraint
    import tensorflow as tf

    return tf.function(constraint)


def test_one_pass_is_clip_columns_rows():
    rng = np.random.default_rng(0)
    for n in (2, 5, 12):
        m = rng.normal(size=(n, n)) + 1.0  # some negative entries, no empty column
        m[0, 0] = -0.5
        expected = _numpy_pass(m.astype(np.float64))
        np.testing.assert_allclose(_apply(DoublyStochastic(1), m), expected, rtol=1e-5, atol=1e-7)


def test_one_pass_order_matters():
    # Columns then rows: rows sum to 1 exactly, columns only approximately.
    m = np.array([[4.0, 1.0], [1.0, 1.0]])
    out = _apply(DoublyStochastic(1), m)
    np.testing.assert_allclose(out.sum(axis=1), [1.0, 1.0], atol=1e-6)
    assert not np.allclose(out.sum(axis=0), 1.0, atol=1e-3)
    rows_then_columns = m / m.sum(axis=1, keepdims=True)
    rows_then_columns /= rows_then_columns.sum(axis=0, keepdims=True)
    assert not np.allclose(out, rows_then_columns, atol=1e-3)


def test_several_passes_repeat_the_pass():
    m = np.random.default_rng(1).random((6, 6))
    expected = m
    for _ in range(3):
        expected = _numpy_pass(expected)
    np.testing.assert_allclose(_apply(DoublyStochastic(3), m), expected, rtol=1e-5)


def test_fifty_passes_are_doubly_stochastic():
    m = np.abs(np.random.default_rng(2).normal(size=(16, 16)))
    out = _apply(DoublyStochastic(50), m)
    np.testing.assert_allclose(out.sum(axis=0), 1.0, atol=1e-5)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(out >= 0)


def _adversarial():
    rng = np.random.default_rng(3)
    zero_row = rng.random((4, 4))
    zero_row[1] = 0.0
    zero_column = rng.random((4, 4))
    zero_column[:, 2] = 0.0
    negative_row = rng.random((4, 4))
    negative_row[0] = -rng.random(4)
    negative_column = rng.random((4, 4))
    negative_column[:, 3] = -5.0
    mixed_scale = rng.random((4, 4))
    mixed_scale[0, 0], mixed_scale[1, 1] = 1e30, 1e-30
    return {
        "all_zero": np.zeros((4, 4)),
        "all_negative": -rng.random((4, 4)),
        "zero_row": zero_row,
        "zero_column": zero_column,
        "negative_row": negative_row,
        "negative_column": negative_column,
        "huge": rng.random((4, 4)) * 1e30,
        "tiny": rng.random((4, 4)) * 1e-30,
        "mixed_scale": mixed_scale,
    }


@pytest.mark.parametrize("iterations", [1, 50])
@pytest.mark.parametrize("name", sorted(_adversarial()))
def test_adversarial_inputs_stay_finite(name, iterations):
    out = _apply(DoublyStochastic(iterations), _adversarial()[name])
    assert np.all(np.isfinite(out)), out
    assert np.all(out >= 0), out
    # A row never sums to more than 1 (rows are divided last).
    assert np.all(out.sum(axis=1) <= 1 + 1e-5)


def test_scale_invariance_on_large_values():
    m = np.random.default_rng(4).random((5, 5))
    np.testing.assert_allclose(
        _apply(DoublyStochastic(1), m * 1e20), _apply(DoublyStochastic(1), m), rtol=1e-5
    )


@pytest.mark.parametrize("iterations", [0, -1, 1.5, "1", None, True])
def test_bad_iterations_rejected(iterations):
    with pytest.raises(ValueError, match="Received: sinkhorn_iterations="):
        DoublyStochastic(iterations)


def test_rejects_non_matrices():
    with pytest.raises(ValueError, match="shape"):
        DoublyStochastic(1)(keras.ops.ones((2, 2, 2)))


def test_serialization():
    constraint = DoublyStochastic(sinkhorn_iterations=7)
    config = keras.saving.serialize_keras_object(constraint)
    assert config["config"] == {"sinkhorn_iterations": 7}
    restored = keras.saving.deserialize_keras_object(config, safe_mode=True)
    assert isinstance(restored, DoublyStochastic)
    assert restored.sinkhorn_iterations == 7
    assert keras.constraints.get(config).sinkhorn_iterations == 7


def test_tiny_positive_columns_and_rows_are_normalised():
    # Entries far below any fixed guard still scale to unit sums: only exact zeros are
    # left as they are.
    w = np.full((3, 3), 1e-30, dtype="float32")
    w[0] = [0.5, 0.2, 0.3]
    out = keras.ops.convert_to_numpy(DoublyStochastic(1)(w))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("value", [1e-38, 1e-45, 3e38])
def test_subnormal_and_near_overflow_matrices_normalise(value):
    # TensorFlow's CPU kernels flush subnormal float32 numbers (1e-38, 1e-45) to zero,
    # and column sums of entries near 3e38 overflow: both used to give all zeros.
    out = _apply(DoublyStochastic(1), np.full((3, 3), value))
    np.testing.assert_allclose(out, np.full((3, 3), 1 / 3), rtol=1e-6)


def test_subnormal_entries_keep_their_proportions_and_negatives_are_clipped():
    m = np.array([[2e-40, 1e-40], [-1e-40, 1e-40]], dtype="float32")
    expected = _numpy_pass(np.array([[2.0, 1.0], [0.0, 1.0]]))
    np.testing.assert_allclose(_apply(DoublyStochastic(1), m), expected, rtol=1e-5)


def test_non_finite_entries_count_as_zero():
    rng = np.random.default_rng(5)
    m = rng.random((4, 4)) + 0.1
    bad = m.copy()
    bad[0, 1], bad[2, 3], bad[3, 0] = np.nan, np.inf, -np.inf
    zeroed = m.copy()
    zeroed[0, 1] = zeroed[2, 3] = zeroed[3, 0] = 0.0
    out = _apply(DoublyStochastic(1), bad)
    np.testing.assert_allclose(out, _apply(DoublyStochastic(1), zeroed), rtol=1e-6)
    assert np.all(np.isfinite(_apply(DoublyStochastic(3), np.full((3, 3), np.nan))))


def test_ordinary_matrices_are_bit_for_bit_algorithm_1():
    # The power-of-two scaling is exact: the same float32 result as the plain steps.
    rng = np.random.default_rng(6)
    for n in (3, 17):
        m = (rng.normal(size=(n, n)) + 0.5).astype("float32")
        w = keras.ops.maximum(keras.ops.convert_to_tensor(m), 0.0)
        w = w / keras.ops.sum(w, axis=0, keepdims=True)
        w = w / keras.ops.sum(w, axis=1, keepdims=True)
        np.testing.assert_array_equal(_apply(DoublyStochastic(1), m), keras.ops.convert_to_numpy(w))


def test_rejects_non_square_matrices():
    with pytest.raises(ValueError, match=r"square.*Received: shape=\(2, 3\)"):
        DoublyStochastic(1)(keras.ops.ones((2, 3)))


@pytest.mark.parametrize("iterations", [1001, 100_000_000])
def test_iterations_are_bounded(iterations):
    with pytest.raises(
        ValueError, match=f"at most 1000.*Received: sinkhorn_iterations={iterations}"
    ):
        DoublyStochastic(iterations)
    assert DoublyStochastic(1000).sinkhorn_iterations == 1000


def test_a_line_the_clip_would_empty_is_refilled_from_its_pre_clip_values():
    # Without the refill an all-negative row or column stays 0 for good (a dead channel).
    m = np.array([[0.5, 0.3, 0.2], [-0.1, -0.4, -0.2], [0.2, 0.3, 0.5]])
    expected = m.copy()
    # Shifted so its largest is 1/N of the matrix's largest (0.5): 1/6; the others clip.
    expected[1] = m[1] - m[1].max() + 0.5 / 3
    np.testing.assert_allclose(
        _apply(DoublyStochastic(1), m), _numpy_pass(expected), rtol=1e-5, atol=1e-7
    )
    column = m.T.copy()
    expected = column.copy()
    expected[:, 1] = column[:, 1] - column[:, 1].max() + 0.5 / 3
    np.testing.assert_allclose(
        _apply(DoublyStochastic(1), column), _numpy_pass(expected), rtol=1e-5, atol=1e-7
    )
    out = _apply(DoublyStochastic(1), -np.random.default_rng(5).random((6, 6)))
    assert np.all(out.sum(axis=0) > 0) and np.all(out.sum(axis=1) > 0)


def _penalty_and_gradient(m):
    """The l1-2 penalty of Eq. (1) on a non-negative matrix and its gradient (sign(0) = 0)."""
    rows = np.sqrt((m * m).sum(axis=1, keepdims=True))
    cols = np.sqrt((m * m).sum(axis=0, keepdims=True))
    penalty = 2 * m.sum() - rows.sum() - cols.sum()
    gradient = 2 * np.sign(m) - m / np.where(rows > 0, rows, 1) - m / np.where(cols > 0, cols, 1)
    return penalty, gradient


@pytest.mark.parametrize("seed", [0, 5])
def test_ten_passes_end_on_a_permutation_where_one_pass_stalls(seed):
    # Penalty-only Algorithm 1 (SGD with momentum 0.9, lr 0.1 linearly decayed, lambda
    # 0.1, 200 steps) from the paper's |N(0, 1)| start. With one pass these seeds stall on
    # the rational tie blocks of docs/lab-notes/training.md (P = 0.88 or 1.35, e.g. rows of
    # (1/2, 1/2)); with ten passes the column sums stay near 1 between steps and every
    # seed ends on an exact permutation (P = 0). Seen in NumPy (float64 and float32) first.
    ends = {}
    for iterations in (1, 10):
        constraint = _as_traced(DoublyStochastic(iterations))
        m = _apply(constraint, np.abs(np.random.default_rng(seed).standard_normal((16, 16))))
        velocity = np.zeros_like(m)
        for step in range(200):
            velocity = 0.9 * velocity - 0.1 * (1 - step / 200) * 0.1 * _penalty_and_gradient(m)[1]
            m = _apply(constraint, m + velocity)
        ends[iterations] = m
    assert _penalty_and_gradient(ends[1])[0] > 0.5
    assert _penalty_and_gradient(ends[10])[0] < 1e-4
    np.testing.assert_array_equal(np.sort(ends[10].round(), axis=1)[:, -1], np.ones(16))
    np.testing.assert_array_equal(ends[10].round().sum(axis=0), np.ones(16))


# --- the name of an unreleased API (`iterations`, now `sinkhorn_iterations`): no alias ---


def test_former_keyword_iterations_is_an_unexpected_keyword():
    with pytest.raises(TypeError, match="unexpected keyword argument 'iterations'"):
        DoublyStochastic(iterations=7)
    config = saved_form(DoublyStochastic, {"iterations": 7})
    with pytest.raises(TypeError, match="unexpected keyword argument 'iterations'"):
        keras.saving.deserialize_keras_object(config, safe_mode=True)


def _exact_sinkhorn(m, passes):
    """Steps 4-6 of Algorithm 1 in exact rational arithmetic (an independent check of the
    scaling: no sum can overflow or underflow there)."""
    w = [
        [fractions.Fraction(float(v)) if v > 0 else fractions.Fraction(0) for v in row] for row in m
    ]
    n = len(w)
    for _ in range(passes):
        for j in range(n):
            total = sum(w[i][j] for i in range(n))
            for i in range(n):
                w[i][j] = w[i][j] / total if total else w[i][j]
        for i in range(n):
            total = sum(w[i])
            w[i] = [v / total if total else v for v in w[i]]
    return np.array([[float(v) for v in row] for row in w])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_sums_stay_finite_at_the_edges_of_the_dtype(dtype):
    # Column and row sums of entries near the dtype's maximum would overflow to inf (and
    # inf / inf is NaN) without the scaling; the result is the exact one, in the dtype.
    if (
        keras.backend.standardize_dtype(keras.ops.convert_to_tensor(np.zeros(1, dtype)).dtype)
        != dtype
    ):
        pytest.skip(f"this backend runs without {dtype} (JAX without x64)")
    info = np.finfo(dtype)
    r = np.random.default_rng(0).random((3, 3)) + 0.1
    cases = {
        "max": np.full((3, 3), info.max),
        "near max": r / r.max() * info.max,
        "wide": np.array([[info.max / 4, 1, 1e-3], [1, info.max / 4, 1], [2, -3, info.max / 4]]),
        "ordinary": r,
    }
    for label, m in cases.items():
        m = m.astype(dtype)
        got = DoublyStochastic(3)(keras.ops.convert_to_tensor(m))
        assert keras.backend.standardize_dtype(got.dtype) == dtype, label
        got = keras.ops.convert_to_numpy(got).astype("float64")
        assert np.isfinite(got).all(), label
        np.testing.assert_allclose(got, _exact_sinkhorn(m, 3), rtol=0, atol=16 * float(info.eps))
