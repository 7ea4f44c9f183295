"""Balanced rounding: the nearest permutation with prescribed g x g block counts.

Between two grouped 1x1 convolutions a permutation matters only through its block counts
(how many channels go from source group a to target group b), and one with the manual
shuffle's counts folds into the manual reshape-transpose. The constraint breaks the
assignment polytope's integrality, so the exact answer is a mixed-integer program; a
time limit returns the best feasible permutation found so far, never an error.
"""

import time
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, sparse

from keras_autoshuffle import _validation
from keras_autoshuffle.permutations import (
    _as_permutation,
    _as_square,
    _check_groups,
    block_counts,
    group_shuffle_permutation,
    invert_permutation,
    matched_mass,
    nearest_permutation,
)


def nearest_balanced_permutation(
    matrix: ArrayLike,
    groups: int,
    counts: ArrayLike | None = None,
    mip_rel_gap: float = 0.0,
    time_limit: float | None = None,
    return_info: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict[str, Any]]:
    """The nearest permutation to `matrix` with prescribed g x g block counts.

    Maximises the matched mass `sum_i M[i, perm[i]]` (equivalently minimises the
    Frobenius distance) over permutations with `block_counts(perm, groups) ==
    counts`, default the counts of ShuffleNet's manual shuffle. First a feasible
    permutation is built (g = 2: Lagrangian bisection on plain assignments, usually
    proven optimal at once; otherwise the plain nearest permutation repaired by
    swaps), then SciPy's `milp` (HiGHS; N^2 binaries, row, column and block
    equalities) improves on it while time remains. With `mip_rel_gap=0` and no
    `time_limit` the result is proven optimal.

    Args:
        matrix: an N x N array.
        groups: the number of groups g, dividing N.
        counts: a (g, g) array of non-negative integers with every row and column
            summing to N // g; default `block_counts(group_shuffle_permutation(N, g), g)`.
        mip_rel_gap: relative optimality gap at which HiGHS may stop (0: exact).
        time_limit: seconds for the whole search; then the best permutation so far
            is returned (with `optimal` False unless it was proven).
        return_info: also return a dict with `mass`, `optimal` (proven within
            `mip_rel_gap`), `gap` (relative gap to the best known bound, NaN if none)
            and `seconds`.

    Returns:
        An int64 vector `perm`, or `(perm, info)` with `return_info=True`.

    Reference:
        HiGHS MIP solver via `scipy.optimize.milp`.
    """
    matrix = _as_square(matrix)
    n = matrix.shape[0]
    groups = _check_groups(n, groups)
    if counts is None:
        counts = block_counts(group_shuffle_permutation(n, groups), groups)
    counts = _check_counts(counts, groups, n // groups)
    if not (0 <= mip_rel_gap < 1):
        raise ValueError(f"`mip_rel_gap` must be in [0, 1). Received: mip_rel_gap={mip_rel_gap}")
    time_limit = _validation.optional_positive_float(time_limit, "time_limit")
    start = time.perf_counter()
    if groups == 2:
        # One free block count: the Lagrangian gives a bound, often reached at once.
        best, bound = _two_group_lagrangian(matrix, int(counts[0, 1]))
    else:
        best, bound = _repair_counts(matrix, nearest_permutation(matrix), counts), np.inf
    mass = matched_mass(matrix, best)
    optimal = mass >= bound - 1e-9 * (1.0 + abs(bound))
    remaining = None if time_limit is None else time_limit - (time.perf_counter() - start)
    if not optimal and (remaining is None or remaining > 0.05):
        result = _milp(matrix, counts, mip_rel_gap, remaining)
        if result.x is not None:
            found = _as_permutation(np.argmax(result.x.reshape(n, n), axis=1).astype(np.int64))
            if np.array_equal(block_counts(found, groups), counts):
                if matched_mass(matrix, found) >= mass:
                    best, mass = found, matched_mass(matrix, found)
                optimal = result.status == 0
        # HiGHS's dual bound (None or absent when it stopped before having one).
        dual = getattr(result, "mip_dual_bound", None)
        if dual is not None and np.isfinite(dual):
            bound = min(bound, -float(dual))
    if not return_info:
        return best
    gap = 0.0 if optimal else ((bound - mass) / max(abs(bound), 1e-12))
    info = {
        "mass": mass,
        "optimal": bool(optimal),
        "gap": float(gap) if np.isfinite(gap) else float("nan"),
        "seconds": time.perf_counter() - start,
    }
    return best, info


def _check_counts(counts, groups, size):
    counts = np.asarray(counts)
    if (
        counts.shape != (groups, groups)
        or not np.all(np.isfinite(counts))
        or not np.all(counts == np.round(counts))
        or np.any(counts < 0)
        or np.any(counts.sum(axis=0) != size)
        or np.any(counts.sum(axis=1) != size)
    ):
        raise ValueError(
            f"`counts` must be a ({groups}, {groups}) array of non-negative integers whose "
            f"rows and columns each sum to {size}. Received: counts={counts.tolist()}"
        )
    return counts.astype(np.int64)


def _milp(matrix, counts, mip_rel_gap, time_limit):
    """HiGHS on the exact program; `time_limit` None runs to proven optimality."""
    n, groups = matrix.shape[0], counts.shape[0]
    size = n // groups
    # Variable k = i * n + j is P[i, j]: output channel i reads input channel j.
    k = np.arange(n * n)
    i, j = np.divmod(k, n)
    block = (j // size) * groups + i // size
    ones = np.ones(n * n)
    equalities = sparse.vstack(
        [
            sparse.csr_matrix((ones, (i, k)), shape=(n, n * n)),
            sparse.csr_matrix((ones, (j, k)), shape=(n, n * n)),
            sparse.csr_matrix((ones, (block, k)), shape=(groups * groups, n * n)),
        ]
    ).tocsr()
    rhs = np.concatenate([np.ones(2 * n), counts.reshape(-1).astype(np.float64)])
    options = {"mip_rel_gap": mip_rel_gap}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    return optimize.milp(
        -matrix.reshape(-1),
        constraints=optimize.LinearConstraint(equalities, rhs, rhs),
        integrality=np.ones(n * n),
        bounds=optimize.Bounds(0, 1),
        options=options,
    )


def _repair_counts(matrix, perm, counts):
    """Swaps the sources of two rows, one swap at a time, until `perm` has `counts`.

    Each step takes, among the swaps that lower the total count violation
    `sum |block_counts - counts|` the most, the one that loses the least mass. A swap
    lowering it by at least 2 always exists (an excess block (a, b), a deficit (a', b)
    in the same target group, and an excess (a', b') in source group a'), so this ends.
    """
    groups = counts.shape[0]
    size = perm.size // groups
    perm = perm.copy()
    target_group = np.arange(perm.size) // size
    while True:
        current = block_counts(perm, groups)
        excess = current - counts
        if not excess.any():
            return perm
        source_group = perm // size
        a_i, b_i = source_group[:, None], target_group[:, None]
        a_j, b_j = source_group[None, :], target_group[None, :]

        # Change of the violation when rows i and j swap sources: (a_i, b_i) and
        # (a_j, b_j) lose one channel, (a_j, b_i) and (a_i, b_j) gain one.
        gain = sum(
            np.abs(excess[a, b] + change) - np.abs(excess[a, b])
            for a, b, change in ((a_i, b_i, -1), (a_j, b_j, -1), (a_j, b_i, 1), (a_i, b_j, 1))
        )
        # Swapping within the same target group or source group changes no count.
        gain = np.where((a_i == a_j) | (b_i == b_j), 0, gain)
        best_gain = gain.min()
        rows = np.arange(perm.size)
        loss = (
            matrix[rows[:, None], perm[:, None]]
            + matrix[rows[None, :], perm[None, :]]
            - matrix[rows[:, None], perm[None, :]]
            - matrix[rows[None, :], perm[:, None]]
        )
        i, j = np.unravel_index(np.argmin(np.where(gain == best_gain, loss, np.inf)), loss.shape)
        perm[i], perm[j] = perm[j], perm[i]


def _two_group_lagrangian(matrix, target, steps=60):
    """Two groups: a permutation with `target` sources of group 0 in group 1, and a bound.

    With g = 2 the block counts have one free entry, c = counts[0, 1]. Adding mu to
    the entries that count toward c and solving the plain assignment gives a
    permutation optimal among those with its own c, and the upper bound
    L(mu) = max mass + mu (c - target) on the mass of every permutation with
    c = target (Lagrangian duality). c grows with mu, so bisection on mu looks for
    c == target; failing that, the two optima just below and above the target are
    combined through their alternating cycles (a subset sum on the cycles' changes
    of c), and failing that the one above the target (or the only one found) is
    repaired by the best single swaps.

    Returns:
        `(perm, bound)`: `perm` has the target count; it is optimal when its mass
            reaches `bound` (the smallest L(mu) seen).
    """
    n = matrix.shape[0]
    size = n // 2
    bonus = np.zeros_like(matrix)
    bonus[size:, :size] = 1.0  # target i in group 1 reads source j in group 0

    def count(perm):
        return int(np.count_nonzero(perm[size:] < size))

    spread = float(matrix.max() - matrix.min()) * n + 1.0
    low = high = None
    mu_low, mu_high = -spread, spread
    bound = np.inf
    for _ in range(steps):
        mu = 0.5 * (mu_low + mu_high)
        perm = nearest_permutation(matrix + mu * bonus)
        c = count(perm)
        bound = min(bound, matched_mass(matrix, perm) + mu * (c - target))
        if c == target:
            return perm, bound
        if c < target:
            low, mu_low = perm, mu
        else:
            high, mu_high = perm, mu
    if low is not None and high is not None:
        perm = _combine_cycles(low, high, target - count(low), size)
        if perm is not None:
            return perm, bound
    return _repair_count(matrix, low if high is None else high, target, size), bound


def _combine_cycles(low, high, need, size):
    """`low` with some of its alternating cycles against `high` swapped in, changing
    its count by exactly `need` (None if no subset of cycles does)."""
    where_low = invert_permutation(low)
    seen = np.zeros(low.size, dtype=bool)
    cycles = []
    for row in np.flatnonzero(low != high):
        rows = []
        while not seen[row]:
            seen[row] = True
            rows.append(row)
            row = where_low[high[row]]
        if rows:
            rows = np.asarray(rows)
            counted = rows[rows >= size]
            change = np.count_nonzero(high[counted] < size) - np.count_nonzero(low[counted] < size)
            cycles.append((rows, int(change)))
    reach = {0: []}
    for k, (_, change) in enumerate(cycles):
        for total, chosen in list(reach.items()):
            reach.setdefault(total + change, chosen + [k])
    if need not in reach:
        return None
    perm = low.copy()
    for k in reach[need]:
        rows = cycles[k][0]
        perm[rows] = high[rows]
    return perm


def _repair_count(matrix, perm, target, size):
    """Two groups: `perm` moved to `target` sources of group 0 in target group 1."""
    counts = np.array([[size - target, target], [target, size - target]])
    return _repair_counts(matrix, perm, counts)
