"""Permutation math in NumPy/SciPy: the nearest permutation (exact rounding), checks,
distances, ShuffleNet's group shuffle and block counts.

Convention used throughout the package: a permutation is an integer vector
`perm` with `P[i, perm[i]] = 1`, so applying it to channels gives
`y[..., i] = x[..., perm[i]]`, the same as multiplying by the matrix `P`.
"""

import numpy as np
from numpy.typing import ArrayLike, DTypeLike
from scipy import optimize

from keras_autoshuffle import _validation


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


def nearest_permutation(matrix: ArrayLike, allowed: ArrayLike | None = None) -> np.ndarray:
    """Returns the permutation nearest to `matrix` in Frobenius norm.

    For permutation matrices `||M - P||^2 = ||M||^2 + N - 2 trace(P^T M)`, so the
    nearest one maximises the matched mass `sum_i M[i, perm[i]]`: the linear
    assignment problem, solved exactly by SciPy (the paper's final rounding).

    Args:
        matrix: an N x N array.
        allowed: optional N x N boolean mask; only entries `(i, perm[i])` where it is
            True may be used (ValueError if no such permutation exists).

    Returns:
        An int64 vector `perm` with `P[i, perm[i]] = 1`.

    Example:
        >>> nearest_permutation([[0.1, 0.9], [0.8, 0.2]])
        array([1, 0])
    """
    matrix = _as_square(matrix)
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        if allowed.shape != matrix.shape:
            raise ValueError(
                f"`allowed` must have the matrix's shape {matrix.shape}. "
                f"Received: allowed.shape={allowed.shape}"
            )
        matrix = np.where(allowed, matrix, -np.inf)
    try:
        rows, cols = optimize.linear_sum_assignment(matrix, maximize=True)
    except ValueError:
        if allowed is None:
            raise
        raise ValueError(
            "No permutation uses only entries where `allowed` is True (infeasible). "
            f"Received: allowed with {int(allowed.sum())} True entries of {allowed.size}"
        ) from None
    perm = np.empty(matrix.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def permutation_matrix(perm: ArrayLike, dtype: DTypeLike = "float32") -> np.ndarray:
    """The 0/1 matrix `P` of `perm`: `P[i, perm[i]] = 1`."""
    perm = _as_permutation(perm)
    matrix = np.zeros((perm.size, perm.size), dtype=dtype)
    matrix[np.arange(perm.size), perm] = 1
    return matrix


def invert_permutation(perm: ArrayLike) -> np.ndarray:
    """The inverse permutation: `inv[perm[i]] = i`."""
    perm = _as_permutation(perm)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.size)
    return inverse


def is_permutation_matrix(matrix: ArrayLike, atol: float = 1e-6) -> bool:
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


def distance_to_permutation(matrix: ArrayLike, perm: ArrayLike | None = None) -> float:
    """Frobenius distance from `matrix` to `perm` (default: the nearest permutation)."""
    matrix = _as_square(matrix)
    perm = nearest_permutation(matrix) if perm is None else _as_permutation(perm)
    difference = matrix - permutation_matrix(perm, dtype=np.float64)
    # Scaled first: squares of entries above ~1e154 overflow float64.
    largest = np.max(np.abs(difference), initial=0.0)
    if largest == 0:
        return 0.0
    return float(largest * np.linalg.norm(difference / largest))


def argmax_permutation(matrix: ArrayLike) -> np.ndarray:
    """Row-wise argmax rounding; may repeat columns, so it may not be a permutation."""
    return np.argmax(_as_square(matrix), axis=1)


def argmax_agrees(matrix: ArrayLike) -> bool:
    """Whether row-wise argmax rounding gives the same permutation as the exact one."""
    return bool(np.array_equal(argmax_permutation(matrix), nearest_permutation(matrix)))


def group_shuffle_permutation(channels: int, groups: int) -> np.ndarray:
    """ShuffleNet's channel shuffle as a permutation vector.

    The shuffle reshapes channels to (groups, channels // groups), transposes and
    flattens, so output channel `i` reads input channel
    `(i % groups) * (channels // groups) + i // groups`.
    """
    channels = _validation.positive_int(channels, "channels")
    groups = _check_groups(channels, groups)
    i = np.arange(channels)
    return (i % groups) * (channels // groups) + i // groups


def _check_groups(channels, groups, name="groups"):
    groups = _validation.positive_int(groups, name)
    if channels % groups:
        raise ValueError(
            f"`{name}` must divide the channel count {channels}. Received: {name}={groups}"
        )
    return int(groups)


def block_counts(perm: ArrayLike, groups: int) -> np.ndarray:
    """The g x g block counts of `perm` between two grouped convolutions.

    With `groups` equal groups on both sides, `counts[a, b]` is how many of the
    output channels in target group `b` read an input channel of source group `a`
    (`y[..., i] = x[..., perm[i]]`, group of channel `c` = `c // (N // groups)`).
    Between two grouped 1x1 convs a permutation matters only through these
    counts: the order inside each group folds into the convs.

    Args:
        perm: a permutation vector of length N.
        groups: the number of groups g, dividing N.

    Returns:
        A (g, g) int64 array whose rows and columns sum to N // g.
    """
    perm = _as_permutation(perm)
    groups = _check_groups(perm.size, groups)
    size = perm.size // groups
    counts = np.zeros((groups, groups), dtype=np.int64)
    np.add.at(counts, (perm // size, np.arange(perm.size) // size), 1)
    return counts


def matched_mass(matrix: ArrayLike, perm: ArrayLike) -> float:
    """`sum_i M[i, perm[i]]` = trace(P^T M), the quantity exact rounding maximises."""
    matrix = _as_square(matrix)
    perm = _as_permutation(perm)
    return float(matrix[np.arange(perm.size), perm].sum())


def decompose(perm: ArrayLike, canonical: ArrayLike, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Splits `perm` into within-group permutations around `canonical`.

    For permutations with the same block counts, returns `(sigma, tau)`, both
    permuting channels only inside their group, with `perm[i] == sigma[canonical[tau[i]]]`.
    """
    perm, canonical = np.asarray(perm), np.asarray(canonical)
    counts = block_counts(perm, groups)
    if not np.array_equal(counts, block_counts(canonical, groups)):
        raise ValueError("`perm` and `canonical` must have the same block counts.")
    size = perm.size // groups
    target = np.arange(perm.size) // size
    tau = np.empty_like(perm)
    for b in range(groups):
        for a in range(groups):
            mine = np.flatnonzero((target == b) & (perm // size == a))
            theirs = np.flatnonzero((target == b) & (canonical // size == a))
            tau[mine] = theirs
    sigma = np.empty_like(perm)
    sigma[canonical[tau]] = perm
    return sigma, tau
