"""The exact permutation penalty of the paper, Eq. (1)."""

import keras
from keras import ops

from keras_autoshuffle import _validation


def _safe_norm(squares_sum):
    # sqrt has an infinite derivative at 0; route zero sums through a constant so
    # the value is exactly 0 and the gradient finite (0) there.
    positive = squares_sum > 0
    safe = ops.where(positive, squares_sum, ops.ones_like(squares_sum))
    return ops.where(positive, ops.sqrt(safe), ops.zeros_like(squares_sum))


def l12_penalty(matrix):
    """The l1-2 penalty P(M) of Eq. (1), over rows plus columns.

    `P(M) = sum_i [sum_j |m_ij| - ||m_i.||_2] + sum_j [sum_i |m_ij| - ||m_.j||_2]`.
    For a doubly stochastic M it is zero exactly at permutations (Theorem 1).
    Computed in float32 whatever the input dtype.

    Args:
        matrix: an N x N tensor.

    Returns:
        A float32 scalar.
    """
    m = ops.cast(ops.convert_to_tensor(matrix), "float32")
    if len(m.shape) != 2:
        raise ValueError(f"l12_penalty expects a 2-D matrix. Received: shape={m.shape}")
    absolute = ops.abs(m)
    squares = ops.square(m)
    rows = ops.sum(absolute, axis=1) - _safe_norm(ops.sum(squares, axis=1))
    columns = ops.sum(absolute, axis=0) - _safe_norm(ops.sum(squares, axis=0))
    return ops.sum(rows) + ops.sum(columns)


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class L12Penalty(keras.regularizers.Regularizer):
    """`strength * l12_penalty(M)` as a Keras regularizer (the paper's lambda * P).

    Args:
        strength: the paper's lambda, a non-negative float (1e-3 on CIFAR-10,
            2e-3 on ImageNet).

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(self, strength=1e-3):
        self.strength = _validation.penalty(strength, "strength")

    def __call__(self, x):
        if len(x.shape) != 2:
            raise ValueError(
                f"L12Penalty applies to rank-2 weights. Received: shape={tuple(x.shape)}"
            )
        return self.strength * l12_penalty(x)

    def get_config(self):
        return {"strength": self.strength}
