"""The doubly stochastic constraint of Algorithm 1 (steps 4-6)."""

from typing import Any

import keras
from keras import ops

from keras_autoshuffle import _validation

# Sinkhorn passes per call. One is the paper's; the row/column sums converge
# geometrically, so a few dozen already reach float32 precision on ordinary matrices and
# more than 1000 only burn time (the initializer runs the constraint when a model is
# built, so a file saying 1e8 would hang `load_model`).
MAX_ITERATIONS = 1000
"""The largest `sinkhorn_iterations` accepted (more only burns time)."""
# The default passes per step of `DoublyStochastic`, `RelaxedShuffle` and the builders.
# One pass is the paper's Algorithm 1; in docs/lab-notes/training.md's runs its matrices stalled on
# fixed points that are not permutations, and ten ended on permutations.
SINKHORN_ITERATIONS = 10
"""The default passes per step of `DoublyStochastic`, `RelaxedShuffle` and the builders."""


def check_iterations(value: Any, name: str = "sinkhorn_iterations") -> int:
    """`value` as an int in [1, MAX_ITERATIONS] (Sinkhorn passes per step); ValueError naming
    `name` otherwise."""
    value = _validation.positive_int(value, name)
    if value > MAX_ITERATIONS:
        raise ValueError(
            f"`{name}` must be at most {MAX_ITERATIONS} (Sinkhorn passes per step; "
            f"more only cost time). Received: {name}={value!r}"
        )
    return value


def _rescaled(w):
    """Divided by a power of two near its largest entry, non-finite entries set to 0.

    Normalising is scale invariant, so this changes no result, but no column sum
    overflows (entries near 3e38) and tiny positive sums still normalise. Dividing by
    a power of two is exact: ordinary matrices give Algorithm 1 bit for bit. Non-finite
    entries (NaN, +-inf, e.g. from a diverged update) count as 0, as clipped negatives
    do, so the constraint never puts NaN into the matrix.
    """
    if keras.backend.standardize_dtype(w.dtype) == "float32":
        # TensorFlow's CPU kernels flush subnormal float32 numbers (below 1.2e-38) to 0
        # in every arithmetic op. When all entries are subnormal or zero (exponent bits
        # 0) their bit patterns, read as integers, are the entries times 2^149 exactly.
        bits = ops.view(w, "int32")
        subnormal = ops.all(ops.bitwise_and(bits, 0x7F800000) == 0)
        w = ops.where(subnormal, ops.cast(bits, "float32"), w)  # negatives stay negative
    w = ops.where(ops.isfinite(w), w, ops.zeros_like(w))
    largest = ops.max(ops.maximum(w, 0.0))
    exponent = ops.floor(ops.log2(ops.where(largest > 0, largest, ops.ones_like(largest))))
    # |exponent| <= 126 keeps 2^-exponent a normal float32 (float16: 14): XLA (JAX,
    # jit_compile) turns a division into a product with the reciprocal, and a subnormal
    # reciprocal is flushed to 0.
    limit = 14 if keras.backend.standardize_dtype(w.dtype) == "float16" else 126
    return w * ops.power(ops.cast(2.0, w.dtype), -ops.clip(exponent, -limit, limit))


def _revive_dead_lines(w, axis):
    """Refills the rows (axis=1) or columns (axis=0) that clipping at 0 would empty.

    An SGD step larger than a line's entries (~1/N; the l1 terms push every positive
    entry down by ~2 lr lambda) empties it, and steps 4-6 keep it at 0 for good: the
    penalty's gradient there is 0 and, with BatchNormalization after the shuffle, the
    loss gradient too. A dead output channel, or a dead network when a whole matrix
    empties (measured: 855 of 1728 rows at the first step of the digits preset at
    lambda 0.2, accuracy at chance). Such a line gets its pre-clip values shifted so
    its largest is 1/N of the matrix's largest entry (1/N for a matrix that was doubly
    stochastic; scale invariant, as the rest of the constraint): the entries the step
    left least negative come back. Lines with a positive entry are returned bit for
    bit, so ordinary steps are Algorithm 1's.
    """
    n = ops.cast(ops.shape(w)[axis], w.dtype)
    largest = ops.max(ops.maximum(w, 0.0))
    share = ops.where(largest > 0, largest, ops.ones_like(largest)) / n
    dead = ops.sum(ops.maximum(w, 0.0), axis=axis, keepdims=True) <= 0
    return ops.where(dead, w - ops.max(w, axis=axis, keepdims=True) + share, w)


def _normalize(w, axis):
    # An all-zero column or row (all negative before clipping) is divided by 1, so it
    # stays zero instead of becoming NaN/inf; any positive sum, however tiny, scales to 1.
    total = ops.sum(w, axis=axis, keepdims=True)
    return w / ops.where(total > 0, total, ops.ones_like(total))


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class DoublyStochastic(keras.constraints.Constraint):
    """Keeps a square matrix non-negative with unit column and row sums.

    One iteration is Algorithm 1, steps 4-6: clip at 0, divide each column by its
    sum, then each row by its sum; exactly so unless the clip would empty a whole row
    or column, which is refilled instead of staying 0 for good (`_revive_dead_lines`).
    More iterations are Sinkhorn (RAS) scaling. The paper found one per SGD step
    enough for validation accuracy; in this package's measurements (docs/lab-notes/training.md)
    one pass stalled on fixed points that are not permutations, so rounding changed the
    net, and ten ended on permutations: the default is ten (`SINKHORN_ITERATIONS`), as in
    `RelaxedShuffle` and the builders; pass 1 for Algorithm 1. The optimizer applies the
    constraint after each update of the variable.

    The matrix is first divided by a power of two near its largest entry (exact, and
    normalising is scale invariant), so huge and tiny matrices normalise like
    ordinary ones. NaN and +-inf entries count as 0, as clipped negatives do: inside
    an optimizer step there is no raising on values, and NaN must not enter M.

    Args:
        sinkhorn_iterations: number of clip/column/row passes, an integer in [1, 1000];
            default 10, 1 is the paper's Algorithm 1 (the name `RelaxedShuffle`, the
            builders and the command line use).

    Example:
        >>> m = DoublyStochastic(sinkhorn_iterations=50)(keras.ops.ones((3, 3)))
        >>> keras.ops.sum(m, axis=0)  # ~[1, 1, 1]

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(self, sinkhorn_iterations: int = SINKHORN_ITERATIONS) -> None:
        self.sinkhorn_iterations = check_iterations(sinkhorn_iterations)

    def __call__(self, w: Any) -> Any:
        w = ops.convert_to_tensor(w)
        if len(w.shape) != 2 or (None not in w.shape and w.shape[0] != w.shape[1]):
            raise ValueError(
                f"DoublyStochastic applies to square 2-D matrices. Received: shape={tuple(w.shape)}"
            )
        w = _revive_dead_lines(_revive_dead_lines(_rescaled(w), axis=1), axis=0)
        for _ in range(self.sinkhorn_iterations):
            w = ops.maximum(w, 0.0)
            w = _normalize(w, axis=0)
            w = _normalize(w, axis=1)
        return w

    def get_config(self) -> dict[str, Any]:
        return {"sinkhorn_iterations": self.sinkhorn_iterations}
