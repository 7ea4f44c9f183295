"""The doubly stochastic constraint of Algorithm 1 (steps 4-6)."""

import keras
from keras import ops


def _normalize(w, axis):
    # An all-zero column or row (all negative before clipping) is divided by 1, so it
    # stays zero instead of becoming NaN/inf; any positive sum, however tiny, scales to 1.
    total = ops.sum(w, axis=axis, keepdims=True)
    return w / ops.where(total > 0, total, ops.ones_like(total))


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class DoublyStochastic(keras.constraints.Constraint):
    """Keeps a square matrix non-negative with unit column and row sums.

    One iteration is exactly Algorithm 1, steps 4-6: clip at 0, divide each
    column by its sum, then each row by its sum. More iterations are Sinkhorn
    (RAS) scaling; the paper found one per SGD step enough. The optimizer applies
    the constraint after each update of the variable.

    Args:
        iterations: number of clip/column/row passes, a positive integer.

    Example:
        >>> m = DoublyStochastic(iterations=50)(keras.ops.ones((3, 3)))
        >>> keras.ops.sum(m, axis=0)  # ~[1, 1, 1]

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(self, iterations=1):
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(
                f"`iterations` must be a positive integer. Received: iterations={iterations}"
            )
        self.iterations = iterations

    def __call__(self, w):
        w = ops.convert_to_tensor(w)
        if len(w.shape) != 2:
            raise ValueError(f"DoublyStochastic applies to 2-D matrices. Received: shape={w.shape}")
        for _ in range(self.iterations):
            w = ops.maximum(w, 0.0)
            w = _normalize(w, axis=0)
            w = _normalize(w, axis=1)
        return w

    def get_config(self):
        return {"iterations": self.iterations}
