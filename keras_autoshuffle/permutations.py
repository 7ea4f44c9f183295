"""Permutation math in NumPy/SciPy: exact rounding, checks and distances.

Convention used throughout the package: a permutation is an integer vector
`perm` with `P[i, perm[i]] = 1`, so applying it to channels gives
`y[..., i] = x[..., perm[i]]`, the same as multiplying by the matrix `P`.
"""

import time

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


def nearest_permutation(matrix, allowed=None):
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


def _check_groups(channels, groups, name="groups"):
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={groups}")
    if channels % groups:
        raise ValueError(
            f"`{name}` must divide the channel count {channels}. Received: {name}={groups}"
        )
    return int(groups)


def block_counts(perm, groups):
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


def matched_mass(matrix, perm):
    """`sum_i M[i, perm[i]]` = trace(P^T M), the quantity exact rounding maximises."""
    matrix = _as_square(matrix)
    perm = _as_permutation(perm)
    return float(matrix[np.arange(perm.size), perm].sum())


def nearest_balanced_permutation(
    matrix, groups, counts=None, mip_rel_gap=0.0, time_limit=None, return_info=False
):
    """The nearest permutation to `matrix` with prescribed g x g block counts.

    Maximises the matched mass `sum_i M[i, perm[i]]` (equivalently minimises the
    Frobenius distance) over permutations with `block_counts(perm, groups) ==
    counts`, default the counts of ShuffleNet's manual shuffle, so that the result
    folds into the manual reshape-transpose between two grouped convs. The
    constraint breaks the assignment polytope's integrality (its LP relaxation is
    fractional on random matrices), so this is solved as a mixed-integer program
    (N^2 binaries; row, column and block equalities) with SciPy's `milp` (HiGHS).
    With `mip_rel_gap=0` and no `time_limit` the result is proven optimal.

    Args:
        matrix: an N x N array.
        groups: the number of groups g, dividing N.
        counts: a (g, g) array of non-negative integers with every row and column
            summing to N // g; default `block_counts(group_shuffle_permutation(N, g), g)`.
        mip_rel_gap: relative optimality gap at which HiGHS may stop (0: exact).
        time_limit: seconds after which HiGHS returns its best permutation so far.
        return_info: also return a dict with `mass`, `optimal` (proven within
            `mip_rel_gap`), `gap` (HiGHS's final relative gap) and `seconds`.

    Returns:
        An int64 vector `perm`, or `(perm, info)` with `return_info=True`.

    Reference:
        HiGHS MIP solver via `scipy.optimize.milp`.
    """
    from scipy import sparse

    matrix = _as_square(matrix)
    n = matrix.shape[0]
    groups = _check_groups(n, groups)
    if counts is None:
        counts = block_counts(group_shuffle_permutation(n, groups), groups)
    counts = np.asarray(counts)
    size = n // groups
    if (
        counts.shape != (groups, groups)
        or not np.all(counts == np.round(counts))
        or np.any(counts < 0)
        or np.any(counts.sum(axis=0) != size)
        or np.any(counts.sum(axis=1) != size)
    ):
        raise ValueError(
            f"`counts` must be a ({groups}, {groups}) array of non-negative integers whose "
            f"rows and columns each sum to {size}. Received: counts={counts.tolist()}"
        )
    if not (0 <= mip_rel_gap < 1):
        raise ValueError(f"`mip_rel_gap` must be in [0, 1). Received: mip_rel_gap={mip_rel_gap}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"`time_limit` must be positive. Received: time_limit={time_limit}")
    start = time.perf_counter()
    fallback = None
    if groups == 2:
        # One free block count: Lagrangian bisection on plain assignments, usually
        # proven optimal in well under a second; the mixed-integer program otherwise.
        fallback, bound = _two_group_lagrangian(matrix, int(counts[0, 1]))
        mass = matched_mass(matrix, fallback)
        if mass >= bound - 1e-9 * (1.0 + abs(bound)):
            info = {"mass": mass, "optimal": True, "gap": 0.0}
            info["seconds"] = time.perf_counter() - start
            return (fallback, info) if return_info else fallback
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
        # The Lagrangian phase counts against the limit (at least 1 s is left to HiGHS).
        options["time_limit"] = max(1.0, float(time_limit) - (time.perf_counter() - start))
    result = optimize.milp(
        -matrix.reshape(-1),
        constraints=optimize.LinearConstraint(equalities, rhs, rhs),
        integrality=np.ones(n * n),
        bounds=optimize.Bounds(0, 1),
        options=options,
    )
    seconds = time.perf_counter() - start
    if result.x is None and fallback is None:
        raise RuntimeError(f"HiGHS found no balanced permutation: {result.message}")
    optimal = result.x is not None and result.status == 0
    if result.x is None:
        perm = fallback  # time limit before HiGHS's first solution: the repaired one
    else:
        perm = _as_permutation(np.argmax(result.x.reshape(n, n), axis=1).astype(np.int64))
        if fallback is not None and not optimal:
            perm = max((perm, fallback), key=lambda p: matched_mass(matrix, p))
    if not np.array_equal(block_counts(perm, groups), counts):
        raise RuntimeError(
            f"HiGHS returned a permutation with other block counts: {result.message}"
        )
    if not return_info:
        return perm
    mass = matched_mass(matrix, perm)
    gap = float(getattr(result, "mip_gap", np.nan))
    if fallback is not None and perm is fallback:
        gap = (bound - mass) / max(abs(bound), 1e-12)  # against the Lagrangian bound
    info = {"mass": mass, "optimal": bool(optimal), "gap": gap, "seconds": seconds}
    return perm, info


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
    """Moves `perm`'s count to `target` by swapping the sources of two rows, one at a
    time, each time the swap that loses the least mass."""
    perm = perm.copy()
    rows = np.arange(perm.size)
    while (c := int(np.count_nonzero(perm[size:] < size))) != target:
        counted = (rows >= size) & (perm < size)
        a, b = np.meshgrid(rows, rows, indexing="ij")
        loss = matrix[a, perm[a]] + matrix[b, perm[b]] - matrix[a, perm[b]] - matrix[b, perm[a]]
        # Keep only swaps that change the count by exactly one in the right direction.
        new_count = c - counted[a].astype(int) - counted[b].astype(int)
        new_count += ((a >= size) & (perm[b] < size)).astype(int)
        new_count += ((b >= size) & (perm[a] < size)).astype(int)
        loss = np.where(new_count == c + (1 if c < target else -1), loss, np.inf)
        k = np.unravel_index(np.argmin(loss), loss.shape)
        i, j = a[k], b[k]
        perm[i], perm[j] = perm[j], perm[i]
    return perm
