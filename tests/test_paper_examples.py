"""The paper's Section 3 examples, minimised with a Keras optimizer and the package's penalty.

Every 2 x 2 doubly stochastic matrix is Q(q) = [[q, 1-q], [1-q, q]], q in [0, 1]. Each test
minimises loss(Q(q)) + lambda * l12_penalty(Q(q)) over q with SGD, q clipped to [0, 1]
after every step (a variable constraint), from several starting points at once (q is a
vector, one entry per start). Where the objective has several local minima the minimiser
is the best of the end points. Expected outcomes: the paper's Section 3; interior
points are checked against closed forms or an independent NumPy computation.

Algorithm 1's own dynamic on a free matrix is different: see docs/algorithm1.md and
test_algorithm1_dynamics_settles_elsewhere below.
"""

import functools
import importlib.util
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from scipy import optimize

from keras_autoshuffle import l12_penalty

STARTS = [0.0, 0.05, 0.3, 0.45, 0.7, 0.95, 1.0]
EPS = 1e-6


def _family(q):
    """Q(q) for a vector q: shape (len(q), 2, 2)."""
    return ops.stack([ops.stack([q, 1 - q], axis=-1), ops.stack([1 - q, q], axis=-1)], axis=1)


def _minimise(loss_fn, penalties, starts=STARTS, steps=1000, learning_rate=0.05):
    """SGD on q from each start, for each lambda in `penalties`.

    Returns:
        Final q's and objective values (NumPy), shape (len(penalties), len(starts)).
    """
    lam = np.repeat(np.asarray(penalties, dtype="float32"), len(starts))
    initial = np.tile(np.asarray(starts, dtype="float32"), len(penalties))
    # q stays in [EPS, 1 - EPS]: at an exact 0 entry the autodiff (sub)gradient of |m_ij| is 0,
    # which on this family cancels the one-sided slope of the l2 terms and kicks q off the
    # end point (the l1 terms are constant, 4, on the whole family; only autodiff sees them).
    q = keras.Variable(np.clip(initial, EPS, 1 - EPS))
    q.constraint = lambda w: ops.clip(w, EPS, 1.0 - EPS)
    optimizer = keras.optimizers.SGD(learning_rate)

    def objective():
        matrices = _family(q)
        return loss_fn(matrices) + lam * ops.vectorized_map(l12_penalty, matrices)

    @tf.function
    def train():
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                total = ops.sum(objective())  # entries are independent: per-entry gradients
            optimizer.apply_gradients([(tape.gradient(total, q), q)])

    train()
    shape = (len(penalties), len(starts))
    return (
        ops.convert_to_numpy(q).reshape(shape),
        ops.convert_to_numpy(objective()).reshape(shape),
    )


def _graph_matching_loss(a, b):
    a = ops.convert_to_tensor(np.asarray(a, dtype="float32"))
    b = ops.convert_to_tensor(np.asarray(b, dtype="float32"))
    return lambda m: ops.sum(ops.square(ops.matmul(a, m) - ops.matmul(m, b)), axis=(1, 2))


EXAMPLE1 = _graph_matching_loss([[1, 2], [3, 1]], [[0, 2], [3, 1]])
EXAMPLE2 = _graph_matching_loss([[2, 1], [1, 0]], [[0, 1], [1, 0]])


def test_example1_loss_is_the_papers_quadratic():
    q = np.linspace(0, 1, 11).astype("float32")
    loss = ops.convert_to_numpy(EXAMPLE1(_family(ops.convert_to_tensor(q))))
    np.testing.assert_allclose(loss, 6 * q**2 - 8 * q + 3, rtol=1e-5, atol=1e-5)


EXAMPLE1_LAMBDAS = [0.0, 0.25, 1.0, 1.5, 2.0]
EXAMPLE2_LAMBDAS = [0.0, 0.5, 1.0, 1.3, 1.8, 2.5, 3.0]
EXAMPLE2_STARTS = [0.0, 0.05, 0.3, 0.45, 0.55, 0.7, 0.95, 1.0]


@functools.cache
def _example1():
    """q and objective for every (lambda, start) of Example 1, computed once."""
    q, values = _minimise(EXAMPLE1, EXAMPLE1_LAMBDAS)
    return dict(zip(EXAMPLE1_LAMBDAS, q, strict=True)), dict(
        zip(EXAMPLE1_LAMBDAS, values, strict=True)
    )


@functools.cache
def _example2():
    q, values = _minimise(EXAMPLE2, EXAMPLE2_LAMBDAS, starts=EXAMPLE2_STARTS)
    return dict(zip(EXAMPLE2_LAMBDAS, q, strict=True)), dict(
        zip(EXAMPLE2_LAMBDAS, values, strict=True)
    )


def test_example1_without_penalty_is_two_thirds():
    q, _ = _example1()
    np.testing.assert_allclose(q[0.0], 2 / 3, atol=1e-4)  # from every start


def test_example1_small_penalty_is_interior():
    # Independent: minimise the paper's F(q) = 6q^2 - 8q + 2 - 4 lambda sqrt(q^2 + (1-q)^2).
    lam = 0.25
    paper = optimize.minimize_scalar(
        lambda q: 6 * q**2 - 8 * q + 2 - 4 * lam * np.sqrt(q**2 + (1 - q) ** 2),
        bounds=(0, 1),
        method="bounded",
        options={"xatol": 1e-10},
    ).x
    q, _ = _example1()
    assert 2 / 3 < paper < 1
    np.testing.assert_allclose(q[lam], paper, atol=1e-4)


@pytest.mark.parametrize("lam", [1.0, 1.5, 2.0])
def test_example1_penalty_recovers_the_permutation(lam):
    q, values = _example1()
    q, values = q[lam], values[lam]
    assert q[np.argmin(values)] == pytest.approx(1.0, abs=1e-3)
    if lam < 2:
        np.testing.assert_allclose(q, 1.0, atol=1e-3)  # from every start
    else:
        # At lambda = 2, F'(0) = 0 and q = 0 is a local minimum: starts near 0 stay there,
        # but F(0) = 3 > F(1) = 1, so the minimiser over [0, 1] is still q = 1.
        assert set(np.round(q, 3)) == {0.0, 1.0}


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0, 1.3])
def test_example2_below_sqrt2_stays_at_one_half(lam):
    q, _ = _example2()
    np.testing.assert_allclose(q[lam], 0.5, atol=1e-4)


def test_example2_between_sqrt2_and_2_interior_minima():
    # Paper: critical points q^2 + (1-q)^2 = lambda^2 / 4, i.e. q = (1 +- sqrt(lambda^2/2 - 1))/2
    # (the two minima of its figure at lambda = 1.8; rounding still gives 0 or 1).
    lam = 1.8
    root = np.sqrt(lam**2 / 2 - 1)
    q, _ = _example2()
    expected = np.where(np.array(EXAMPLE2_STARTS) < 0.5, (1 - root) / 2, (1 + root) / 2)
    np.testing.assert_allclose(q[lam], expected, atol=1e-3)


@pytest.mark.parametrize("lam", [2.5, 3.0])
def test_example2_above_2_is_a_permutation(lam):
    q, values = _example2()
    expected = (np.array(EXAMPLE2_STARTS) > 0.5).astype(float)
    np.testing.assert_allclose(q[lam], expected, atol=1e-4)
    np.testing.assert_allclose(values[lam], values[lam][0], rtol=1e-5)  # F(0) = F(1)


# --- Example 3: two-layer ReLU network with shortcut -----------------------------------

# Midpoint quadrature on a 200 x 200 grid over [-1, 1]^2 (deterministic; error ~1e-4).
_GRID = 200
_NODES = (np.arange(_GRID) + 0.5) / _GRID * 2 - 1
_X = np.stack([g.ravel() for g in np.meshgrid(_NODES, _NODES)]).astype("float32")  # (2, K)
TEACHER = np.array([[1 / 3, 2 / 3], [1 / 4, 3 / 4]])


def _network(weights, m):
    """f_m(x, W) = ||relu((m I + W) x)||_1 on the grid, for a batch of W: (batch, K)."""
    hidden = ops.matmul(m * ops.eye(2) + weights, ops.convert_to_tensor(_X))
    return ops.sum(ops.relu(hidden), axis=-2)


def _example3_loss(m, scale):
    """E_x[(f_m(x, W) - f_m(x, W*))^2], x uniform on [-1, 1]^2, times `scale`.

    The teacher has the same shortcut m (the paper's Example 3). scale=1 is the expectation;
    scale=4 is the integral over the square, the normalisation of the paper's closed forms
    (its Eq. for E phi((m+p)x1 + (1-p)x2)^2 = 2/3 [(m+p)^2 + (1-p)^2] is 4x the mean).
    """
    teacher = _network(ops.convert_to_tensor(TEACHER[None].astype("float32")), m)
    return lambda w: scale * ops.mean(ops.square(_network(w, m) - teacher), axis=-1)


def test_example3_quadrature_matches_the_papers_closed_form():
    m = 1.0
    for p in (0.0, 0.3, 0.55, 1.0):
        hidden = (m + p) * _X[0] + (1 - p) * _X[1]
        integral = 4 * np.mean(np.maximum(hidden, 0) ** 2)
        assert integral == pytest.approx(2 / 3 * ((m + p) ** 2 + (1 - p) ** 2), rel=1e-4)


EXAMPLE3_STARTS = [0.0, 0.2, 0.45, 0.7, 1.0]


@functools.cache
def _example3(scale):
    """p and objective for lambda in (0, 0.4) and every start, m = 1, computed once."""
    return _minimise(
        _example3_loss(m=1.0, scale=scale),
        [0.0, 0.4],
        starts=EXAMPLE3_STARTS,
        steps=300,
        learning_rate=0.5 / scale,
    )


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_example3_unpenalised_optimum_rounds_to_the_wrong_permutation(scale):
    p = _example3(scale)[0][0]
    np.testing.assert_allclose(p, p[0], atol=1e-3)  # one interior minimum, from every start
    assert 0.52 < p[0] < 0.58  # the paper's Example 3: about 0.55
    assert np.round(p[0]) == 1  # rounding picks p = 1 ...
    loss = _example3_loss(m=1.0, scale=scale)
    ends = ops.convert_to_numpy(loss(_family(ops.convert_to_tensor([0.0, 1.0]))))
    assert ends[0] < ends[1]  # ... but p = 0 is the better permutation


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_example3_penalty_picks_the_right_permutation(scale):
    p, values = (a[1] for a in _example3(scale))
    assert p[np.argmin(values)] == pytest.approx(0.0, abs=1e-4)
    # Starts below the objective's interior maximum end at p = 0, above it at p = 1
    # (scale 1) or at a shallow local minimum near 0.76 (scale 4); both worse than p = 0.
    assert p[0] == p[1] == pytest.approx(0.0, abs=1e-4)
    elsewhere = p > 1e-3
    assert elsewhere.any() and np.all(values[elsewhere] > values[0] + 1e-3)


# --- Algorithm 1 (free matrix + column/row scaling) settles elsewhere ---------------------


def _algorithm1_example():
    path = pathlib.Path(__file__).parents[1] / "examples" / "algorithm1_dynamics.py"
    spec = importlib.util.spec_from_file_location("algorithm1_dynamics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("iterations", [1, 50])
def test_algorithm1_dynamics_settles_elsewhere(iterations):
    example = _algorithm1_example()
    m, change = example.settle("example1", iterations=iterations, learning_rate=0.02)
    assert change < 1e-6  # a fixed point ...
    assert m[0, 0] == pytest.approx(0.7071, abs=1e-3)  # ... near 0.71, not at q = 2/3
    assert abs(m[0, 0] - 2 / 3) > 0.03
    m, _ = example.settle("example2", iterations=iterations, learning_rate=0.02)
    # Example 2: runs off q = 1/2 to the boundary; the result rounds to the swap.
    assert abs(m[0, 0] - 0.5) > 0.3
    assert m[1, 1] == 0.0
    assert m[1, 0] == pytest.approx(1.0, abs=1e-5)
