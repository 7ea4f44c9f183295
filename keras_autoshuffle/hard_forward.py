"""The hard forward pass of a learned shuffle (`RelaxedShuffle(forward="hard")`).

The nearest permutation of the matrix in the forward pass, found by linear assignment
inside a traced (compiled) step too, and the matrix's own gradient in the backward pass
(straight-through).
"""

from typing import Any

import keras
import numpy as np
from keras import ops

from keras_autoshuffle import permutations

FORWARDS = ("relaxed", "hard")
"""What a learned shuffle computes while training (`RelaxedShuffle(forward=...)`)."""


def _assignment_int32(matrix):
    return permutations.nearest_permutation(np.asarray(matrix, np.float64)).astype(np.int32)


def nearest_permutation_op(matrix: Any) -> Any:
    """The nearest permutation of a square `matrix` as an int32 tensor, inside a traced
    (compiled) step too: SciPy's linear assignment runs on the host, through
    `tf.numpy_function` on TensorFlow (so not under XLA, `jit_compile=True`) and
    `jax.pure_callback` on JAX; eagerly on other backends."""
    size = matrix.shape[0]
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        perm = tf.numpy_function(_assignment_int32, [matrix], tf.int32, stateful=False)
        perm.set_shape((size,))
        return perm
    if backend == "jax":
        import jax

        shape = jax.ShapeDtypeStruct((size,), np.int32)
        return jax.pure_callback(_assignment_int32, shape, matrix)
    return ops.convert_to_tensor(_assignment_int32(ops.convert_to_numpy(matrix)), "int32")


def straight_through(matrix: Any) -> Any:
    """The permutation matrix nearest to `matrix` in the forward pass (exactly: P + (M - M)),
    the identity map to `matrix` in the backward pass."""
    hard = ops.one_hot(nearest_permutation_op(ops.stop_gradient(matrix)), matrix.shape[0])
    hard = ops.cast(hard, matrix.dtype)
    return ops.stop_gradient(hard) + (matrix - ops.stop_gradient(matrix))
