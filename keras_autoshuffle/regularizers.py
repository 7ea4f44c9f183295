"""The exact permutation penalty of the paper, Eq. (1)."""

from typing import Any

import keras
from keras import ops

from keras_autoshuffle import _validation


def _safe_norm(squares_sum):
    # sqrt has an infinite derivative at 0; route zero sums through a constant so
    # the value is exactly 0 and the gradient finite (0) there.
    positive = squares_sum > 0
    safe = ops.where(positive, squares_sum, ops.ones_like(squares_sum))
    return ops.where(positive, ops.sqrt(safe), ops.zeros_like(squares_sum))


def l12_penalty(matrix: Any) -> Any:
    """The l1-2 penalty P(M) of Eq. (1), over rows plus columns.

    `P(M) = sum_i [sum_j |m_ij| - ||m_i.||_2] + sum_j [sum_i |m_ij| - ||m_.j||_2]`.
    For a doubly stochastic M it is zero exactly at permutations (Theorem 1); the
    formula is defined for any 2-D matrix, rectangular ones included.
    Computed in float64 for float64 input, else in float32. P is positively
    homogeneous, `P(cM) = c P(M)`: it is computed on M divided by a power of two near
    max|m_ij| and scaled back, so no square or sum overflows or underflows (every norm
    stays finite for every finite input, float64 near its maximum included), and
    ordinary matrices give the unscaled formula's value bit for bit (dividing by a power
    of two is exact). Only a value beyond the dtype's range (entries within a factor
    ~2N of its maximum) is +inf; a matrix with NaN or inf entries gives NaN (P is
    undefined there).

    Args:
        matrix: a 2-D tensor, normally N x N.

    Returns:
        A scalar: float64 for float64 input, else float32.
    """
    m = ops.convert_to_tensor(matrix)
    if len(m.shape) != 2:
        raise ValueError(f"l12_penalty expects a 2-D matrix. Received: shape={tuple(m.shape)}")
    dtype = "float64" if keras.backend.standardize_dtype(m.dtype) == "float64" else "float32"
    m = ops.cast(m, dtype)
    largest = ops.max(ops.abs(m))
    exponent = ops.floor(ops.log2(ops.where(largest > 0, largest, ops.ones_like(largest))))
    # 2^-exponent stays a normal number: XLA (JAX, jit_compile) divides by multiplying
    # with the reciprocal and flushes a subnormal one to 0.
    limit = 1022 if dtype == "float64" else 126
    exponent = ops.clip(exponent, -limit, limit)
    two = ops.cast(2.0, dtype)
    # Constants for the gradient: P(M / s) s has P's gradient, exactly.
    scale = ops.stop_gradient(ops.power(two, exponent))
    m = m * ops.stop_gradient(ops.power(two, -exponent))  # max |m_ij| in [1, 2)
    absolute = ops.abs(m)
    squares = ops.square(m)
    rows = ops.sum(absolute, axis=1) - _safe_norm(ops.sum(squares, axis=1))
    columns = ops.sum(absolute, axis=0) - _safe_norm(ops.sum(squares, axis=0))
    return scale * (ops.sum(rows) + ops.sum(columns))  # 0 stays 0 at any scale


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class L12Penalty(keras.regularizers.Regularizer):
    """`penalty * l12_penalty(M)` as a Keras regularizer (the paper's lambda * P).

    Args:
        penalty: the paper's lambda, a non-negative float (1e-3 on CIFAR-10,
            2e-3 on ImageNet): the name `RelaxedShuffle` and the builders use.

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(self, penalty: float = 1e-3) -> None:
        self.penalty = _validation.penalty(penalty, "penalty")

    def __call__(self, x: Any) -> Any:
        if len(x.shape) != 2:
            raise ValueError(
                f"L12Penalty applies to rank-2 weights. Received: shape={tuple(x.shape)}"
            )
        return self.penalty * l12_penalty(x)

    def get_config(self) -> dict[str, Any]:
        return {"penalty": self.penalty}
