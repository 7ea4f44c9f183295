"""Permutation math in NumPy/SciPy: exact rounding, checks and distances.

Convention used throughout the package: a permutation is an integer vector
`perm` with `P[i, perm[i]] = 1`, so applying it to channels gives
`y[..., i] = x[..., perm[i]]`, the same as multiplying by the matrix `P`.
"""

import numpy as np
from scipy import optimize


def _as_square(matrix, name="matrix"):
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(
            f"`{name}` must be a square 2-D matrix. Received: {name}.shape={matrix.shape}"
        )
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"`{name}` must hold only finite values. Received: {matrix}")
    return matrix


def _as_permutation(perm, name="perm"):
    perm = np.asarray(perm)
    n = perm.shape[0] if perm.ndim == 1 else -1
    if perm.ndim != 1 or not np.array_equal(np.sort(perm), np.arange(n)):
        raise ValueError(f"`{name}` must be a permutation of 0..n-1. Received: {name}={perm}")
    return perm.astype(np.int64)


def nearest_permutation(matrix):
    """Returns the permutation nearest to `matrix` in Frobenius norm.

    For permutation matrices `||M - P||^2 = ||M||^2 + N - 2 trace(P^T M)`, so the
    nearest one maximises the matched mass `sum_i M[i, perm[i]]`: the linear
    assignment problem, solved exactly by SciPy (the paper's final rounding).

    Args:
        matrix: an N x N array.

    Returns:
        An int64 vector `perm` with `P[i, perm[i]] = 1`.

    Example:
        >>> nearest_permutation([[0.1, 0.9], [0.8, 0.2]])
        array([1, 0])
    """
    matrix = _as_square(matrix)
    rows, cols = optimize.linear_sum_assignment(matrix, maximize=True)
    perm = np.empty(matrix.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def permutation_matrix(perm, dtype="float32"):
    """The 0/1 matrix `P` of `perm`: `P[i, perm[i]] = 1`."""
    perm = _as_permutation(perm)
    matrix = np.zeros((perm.size, perm.size), dtype=dtype)
    matrix[np.arange(perm.size), perm] = 1
    return matrix


def invert_permutation(perm):
    """The inverse permutation: `inv[perm[i]] = i`."""
    perm = _as_permutation(perm)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.size)
    return inverse


def is_permutation_matrix(matrix, atol=1e-6):
    """Whether `matrix` is a permutation matrix up to `atol` entrywise."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        return False
    rounded = np.round(matrix)
    if not np.allclose(matrix, rounded, atol=atol, rtol=0):
        return False
    return bool(
        np.all((rounded == 0) | (rounded == 1))
        and np.all(rounded.sum(axis=0) == 1)
        and np.all(rounded.sum(axis=1) == 1)
    )


def distance_to_permutation(matrix, perm=None):
    """Frobenius distance from `matrix` to `perm` (default: the nearest permutation)."""
    matrix = _as_square(matrix)
    perm = nearest_permutation(matrix) if perm is None else _as_permutation(perm)
    return float(np.linalg.norm(matrix - permutation_matrix(perm, dtype=np.float64)))


def argmax_permutation(matrix):
    """Row-wise argmax rounding; may repeat columns, so it may not be a permutation."""
    return np.argmax(_as_square(matrix), axis=1)


def argmax_agrees(matrix):
    """Whether row-wise argmax rounding gives the same permutation as the exact one."""
    return bool(np.array_equal(argmax_permutation(matrix), nearest_permutation(matrix)))


def group_shuffle_permutation(channels, groups):
    """ShuffleNet's channel shuffle as a permutation vector.

    The shuffle reshapes channels to (groups, channels // groups), transposes and
    flattens, so output channel `i` reads input channel
    `(i % groups) * (channels // groups) + i // groups`.
    """
    if groups < 1 or channels % groups:
        raise ValueError(
            f"`channels` must be divisible by `groups`. Received: channels={channels}, "
            f"groups={groups}"
        )
    i = np.arange(channels)
    return (i % groups) * (channels // groups) + i // groups
