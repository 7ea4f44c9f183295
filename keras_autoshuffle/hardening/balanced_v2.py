"""Balanced rounding for ShuffleNet v2: permutations whose folded routing is SPLIT + CONCAT.

In a folded v2 (`keras_autoshuffle.folding`) each unit's output is cut into one piece per
later unit that consumes part of it. Balanced v2 hardening restricts every shuffle so that
each output is cut at most once, into two equal halves: the folded network then costs
what the same net with no shuffle costs. That is a restriction of the routing counts
(`canonical.py`), the only thing a v2 shuffle is: the result is neither the learned routing
nor the manual one (whose outputs are cut into up to four pieces), but the nearest routing
of that cheap family to the learned matrices.
"""

import itertools
import time
from typing import Any

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.hardening.balanced import nearest_balanced_permutation
from keras_autoshuffle.permutations import _as_square, matched_mass, nearest_permutation


def nearest_balanced_v2_permutation(
    model: keras.Model, shuffle_name: str, matrix: ArrayLike, time_limit: float | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """The nearest permutation for a v2 shuffle whose folded routing is SPLIT + CONCAT.

    Balanced v2 hardening keeps the folded routing as lean as the same net with no
    shuffle: every unit's output is cut at most once, into two equal halves, each
    consumed whole by one later unit, so each unit costs at most one SPLIT (its
    output) and one CONCAT (its branch input). For the shuffle after unit K this
    means: every block waiting in the identity half (the kept part of an earlier
    unit's output) goes wholly to the identity or wholly to the next branch (a block
    that is a whole output may also go half to each side), and unit K's output goes
    wholly to one side or half to each. After the down-sampling unit, the left and
    right branches go one wholly to each side, or half and half: the manual
    shuffle's 2 x 2 block counts (`nearest_balanced_permutation` with 2 groups). The
    last shuffle of a stage is free: the stage end takes every channel in any order.

    Each option is an exact linear assignment with forbidden entries, or the
    two-group balanced problem; the best option is returned. It is optimal for this
    layer given the earlier shuffles of its stage, which must be hardened first
    (harden in network order): they define the blocks.

    Args:
        model: a ShuffleNet v2 from `keras_autoshuffle.applications`.
        shuffle_name: the shuffle layer's name, `stageS_unitK_shuffle`.
        matrix: its N x N relaxed matrix.
        time_limit: seconds for the mixed-integer program (None: proven optimal).

    Returns:
        `(perm, info)`; info has `mass`, `optimal` and `seconds`.
    """
    start = time.perf_counter()
    matrix = _as_square(matrix)
    architecture = arch.describe(model)
    if architecture is None or architecture.family != "v2":
        raise ValueError(
            "Balanced v2 hardening needs a ShuffleNet v2 from keras_autoshuffle.applications. "
            f"Received: model={getattr(model, 'name', model)!r}"
        )
    stage, unit = architecture.shuffle_position(shuffle_name)
    repeats = architecture.repeats[stage - 2]
    channels = 2 * arch.v2_half(model, stage)
    if matrix.shape[0] != channels:
        raise ValueError(
            f"`matrix` must be {channels} x {channels} for {shuffle_name!r}. "
            f"Received: matrix.shape={matrix.shape}"
        )
    time_limit = _validation.optional_positive_float(time_limit, "time_limit")
    if unit == repeats:
        perm = nearest_permutation(matrix)
        return perm, _v2_info(matrix, perm, True, start)
    state = arch.v2_stage_sources(model, stage, unit)[-1]
    producers = {}
    for position, (producer, _) in enumerate(state):
        producers.setdefault(producer, []).append(position)
    # Identity-half blocks: each earlier producer's channels still waiting (none in unit 1).
    blocks = [np.asarray(p) for producer, p in producers.items() if unit > 1 and producer != unit]
    perm, optimal = _nearest_v2_routed(matrix, blocks, time_limit)
    return perm, _v2_info(matrix, perm, optimal, start)


def _nearest_v2_routed(matrix, blocks, time_limit=None):
    """The nearest permutation that keeps a v2 shuffle's folded routing SPLIT + CONCAT.

    Sources 0..h-1 are the identity half, h..n-1 the fresh branch output; targets
    0..h-1 are the next identity half, h..n-1 the next branch. Each of `blocks`
    (arrays of identity sources) goes wholly to one side; the fresh output goes
    wholly to one side or half to each. With no blocks (after the down unit, whose
    two branches are both fresh) the two halves go one wholly to each side, or half
    and half (`nearest_balanced_permutation` with 2 groups). A block that is a whole
    earlier output (half the channels) may also go half to each side. Returns
    `(perm, optimal)`; keeping every block and sending the fresh output to the branch
    is always an option.
    """
    n = matrix.shape[0]
    half = n // 2
    if not blocks:
        blocks = [np.arange(half)]  # the left branch; the right one takes the other side
    candidates, optimal = [], True
    for chosen in itertools.product((False, True), repeat=len(blocks)):
        # chosen[b]: block b goes to the next branch (targets half..n-1).
        fresh_to_branch = half - sum(b.size for b, c in zip(blocks, chosen, strict=True) if c)
        if fresh_to_branch not in (0, half) and 2 * fresh_to_branch != half:
            continue
        allowed = np.ones((n, n), dtype=bool)
        for block, to_branch in zip(blocks, chosen, strict=True):
            allowed[slice(0, half) if to_branch else slice(half, n), block] = False
        try:
            candidates.append(nearest_permutation(matrix, allowed=allowed))
        except ValueError:  # infeasible: more than half the targets asked of one side
            continue
    if len(blocks) == 1 and blocks[0].size == half and half % 2 == 0:
        # Always feasible: under a time limit, the best permutation found so far.
        perm, info = nearest_balanced_permutation(
            matrix, 2, time_limit=time_limit, return_info=True
        )
        candidates.append(perm)
        optimal = info["optimal"]
    return max(candidates, key=lambda p: matched_mass(matrix, p)), optimal


def _v2_info(matrix, perm, optimal, start):
    return {
        "mass": matched_mass(matrix, perm),
        "optimal": bool(optimal),
        "seconds": time.perf_counter() - start,
    }
