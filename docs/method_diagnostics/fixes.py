"""The dead row/column guard, written as it would go into constraints.py (keras.ops only)."""

from keras import ops

from keras_autoshuffle.constraints import _normalize


def _revive(w, clipped, axis):
    """Refills each all-zero row (axis=1) or column (axis=0) of `clipped`.

    The refill is the pre-clip line `w` shifted so that its largest entry is 1/N,
    then clipped: the entries the step left least negative (those within 1/N of
    the largest) come back, in their pre-clip proportions. Lines with a positive
    sum are returned bit for bit.
    """
    n = ops.cast(ops.shape(w)[axis], w.dtype)
    dead = ops.sum(clipped, axis=axis, keepdims=True) <= 0
    refill = ops.maximum(w - ops.max(w, axis=axis, keepdims=True) + 1.0 / n, 0.0)
    return ops.where(dead, refill, clipped)


def guarded_call(self, w):
    w = ops.convert_to_tensor(w)
    if len(w.shape) != 2:
        raise ValueError(f"DoublyStochastic applies to 2-D matrices. Received: shape={w.shape}")
    for _ in range(self.iterations):
        clipped = ops.maximum(w, 0.0)
        clipped = _revive(w, clipped, axis=1)
        clipped = _revive(w, clipped, axis=0)
        w = _normalize(clipped, axis=0)
        w = _normalize(w, axis=1)
    return w
