"""Tests of the NumPy/SciPy permutation math against brute force."""

import itertools
import math

import numpy as np
import pytest
from helpers import _brute_force_best

from keras_autoshuffle import (
    argmax_agrees,
    argmax_permutation,
    distance_to_permutation,
    group_shuffle_permutation,
    invert_permutation,
    is_permutation_matrix,
    nearest_permutation,
    permutation_matrix,
    permutations,
)


def _brute_force_nearest(matrix):
    """The permutation minimising the Frobenius distance, by trying all n! of them."""
    n = matrix.shape[0]
    best, best_distance = None, np.inf
    for perm in itertools.permutations(range(n)):
        p = np.zeros((n, n))
        p[np.arange(n), perm] = 1
        distance = np.linalg.norm(matrix - p)
        if distance < best_distance:
            best, best_distance = np.array(perm), distance
    return best, best_distance


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_nearest_permutation_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        matrix = rng.random((n, n))
        perm = nearest_permutation(matrix)
        expected, expected_distance = _brute_force_nearest(matrix)
        np.testing.assert_array_equal(perm, expected)
        assert perm.dtype == np.int64
        assert distance_to_permutation(matrix) == pytest.approx(expected_distance, rel=1e-12)


def test_nearest_permutation_convention():
    # P[i, perm[i]] = 1: row 0 has its mass in column 2, and so on.
    matrix = np.array([[0.1, 0.0, 0.9], [0.8, 0.1, 0.1], [0.1, 0.9, 0.0]])
    np.testing.assert_array_equal(nearest_permutation(matrix), [2, 0, 1])
    x = np.arange(3.0) * 10
    p = permutation_matrix([2, 0, 1])
    # Applying P to channels is the same as indexing with perm.
    np.testing.assert_array_equal(p @ x, x[[2, 0, 1]])


def test_argmax_disagrees_with_exact_rounding():
    # Both rows put their largest entry in column 0: argmax is not a permutation.
    matrix = np.array([[0.6, 0.4], [0.55, 0.45]])
    np.testing.assert_array_equal(argmax_permutation(matrix), [0, 0])
    assert not argmax_agrees(matrix)
    # The exact projection still returns a permutation: 0.6 + 0.45 > 0.4 + 0.55.
    np.testing.assert_array_equal(nearest_permutation(matrix), [0, 1])


def test_argmax_agrees_near_a_permutation():
    rng = np.random.default_rng(0)
    perm = rng.permutation(7)
    matrix = 0.9 * permutation_matrix(perm) + 0.1 * rng.random((7, 7)) / 7
    assert argmax_agrees(matrix)
    np.testing.assert_array_equal(nearest_permutation(matrix), perm)


def test_is_permutation_matrix():
    assert is_permutation_matrix(permutation_matrix([1, 2, 0]))
    assert is_permutation_matrix(permutation_matrix([1, 0]) + 1e-8)
    assert not is_permutation_matrix(np.full((2, 2), 0.5))
    assert not is_permutation_matrix(np.array([[1.0, 0.0], [1.0, 0.0]]))  # repeated column
    assert not is_permutation_matrix(np.eye(3)[:2])  # not square
    assert not is_permutation_matrix(2 * np.eye(2))


def test_distance_to_given_permutation():
    matrix = np.array([[0.7, 0.3], [0.2, 0.8]])
    # Independent: sqrt(0.3^2 + 0.3^2 + 0.2^2 + 0.2^2) to the identity.
    assert distance_to_permutation(matrix, [0, 1]) == pytest.approx(np.sqrt(0.26))
    assert distance_to_permutation(matrix, [1, 0]) == pytest.approx(
        np.sqrt(0.7**2 + 0.7**2 + 0.8**2 + 0.8**2)
    )


def test_invert_permutation():
    perm = np.random.default_rng(3).permutation(9)
    inverse = invert_permutation(perm)
    np.testing.assert_array_equal(perm[inverse], np.arange(9))
    np.testing.assert_array_equal(permutation_matrix(inverse), permutation_matrix(perm).T)


def test_group_shuffle_permutation_is_reshape_transpose():
    for channels, groups in [(12, 3), (12, 4), (24, 8), (6, 1), (6, 6)]:
        expected = np.arange(channels).reshape(groups, channels // groups).T.ravel()
        np.testing.assert_array_equal(group_shuffle_permutation(channels, groups), expected)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: nearest_permutation(np.ones((2, 3))), "matrix"),
        (lambda: nearest_permutation(np.ones(3)), "matrix"),
        (lambda: nearest_permutation([[np.nan, 0.0], [0.0, 1.0]]), "matrix"),
        (lambda: permutation_matrix([0, 0, 1]), "perm"),
        (lambda: invert_permutation([1, 2]), "perm"),
        (lambda: distance_to_permutation(np.eye(2), [0, 2]), "perm"),
        (lambda: group_shuffle_permutation(10, 3), "divide the channel count 10.*groups=3"),
        (lambda: group_shuffle_permutation(10, 0), "groups"),
        (lambda: group_shuffle_permutation(6, 1.5), r"Received: groups=1\.5"),
        (lambda: group_shuffle_permutation(6, 2.0), r"Received: groups=2\.0"),
        (lambda: group_shuffle_permutation(-6, 2), "Received: channels=-6"),
        (lambda: group_shuffle_permutation(6.0, 2), r"Received: channels=6\.0"),
        (lambda: group_shuffle_permutation(6, True), "Received: groups=True"),
    ],
)
def test_bad_input_raises(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


def test_block_counts_independent_numpy():
    perm = permutations.group_shuffle_permutation(6, 3)  # [0, 2, 4, 1, 3, 5]
    # Outputs 0-1 (target group 0) read inputs 0, 2 (source groups 0, 1); outputs 2-3
    # read 4, 1 (groups 2, 0); outputs 4-5 read 3, 5 (groups 1, 2).
    np.testing.assert_array_equal(
        permutations.block_counts(perm, 3), [[1, 1, 0], [1, 0, 1], [0, 1, 1]]
    )
    np.testing.assert_array_equal(permutations.block_counts(np.arange(6), 2), [[3, 0], [0, 3]])
    with pytest.raises(ValueError, match="groups"):
        permutations.block_counts(np.arange(6), 4)


def test_nearest_permutation_with_allowed_mask_by_brute_force():
    rng = np.random.default_rng(7)
    matrix = rng.random((7, 7))
    allowed = rng.random((7, 7)) < 0.6
    perm = permutations.nearest_permutation(matrix, allowed=allowed)
    assert allowed[np.arange(7), perm].all()
    best = _brute_force_best(matrix, lambda p: allowed[np.arange(7), p].all())
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-12)
    with pytest.raises(ValueError, match="infeasible.*Received: allowed with 6 True"):
        permutations.nearest_permutation(matrix, allowed=np.eye(7, k=1, dtype=bool))
    with pytest.raises(ValueError, match="allowed"):
        permutations.nearest_permutation(matrix, allowed=np.ones((6, 6), dtype=bool))


def test_distance_to_permutation_stays_finite_near_float64s_maximum():
    # Squares of entries above ~1e154 overflow float64; the distance itself is finite.
    for scale in (1e200, np.finfo(np.float64).max / 4):
        m = np.array([[scale, 0.0], [0.0, scale]])
        exact = math.sqrt(2) * (scale - 1)  # two diagonal entries off by scale - 1
        assert distance_to_permutation(m) == pytest.approx(exact, rel=1e-15)
    assert distance_to_permutation(np.eye(3)) == 0.0
