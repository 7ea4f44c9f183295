"""Every custom layer of the package, registered for `.keras` files on import.

The learned `RelaxedShuffle` and ShuffleNet's fixed `ChannelShuffle`; the channel
split of ShuffleNet v2 (`ChannelSplit`) and the contiguous slice folding uses
(`ChannelSlice`); `GroupedConv2D`, a Conv2D whose grouped form trains fast on TF CPUs.
"""

import keras
import numpy as np
from keras import layers, ops

from keras_autoshuffle import _keras_internals, _validation, permutations
from keras_autoshuffle.constraints import DoublyStochastic
from keras_autoshuffle.regularizers import L12Penalty, l12_penalty


def _channel_axis(data_format):
    data_format = _validation.data_format(data_format)
    return data_format, _validation.channel_axis(data_format)


def _check_channels(layer, inputs, expected):
    """A clear error when a built layer is called on another channel count."""
    channels = inputs.shape[layer._channel_axis]
    if channels is not None and channels != expected:
        raise ValueError(
            f"Layer '{layer.name}' was built for {expected} channels. "
            f"Received: input of shape {tuple(inputs.shape)}"
        )


def _permute_channels(x, perm, channel_axis):
    return ops.take(x, ops.convert_to_tensor(perm, dtype="int32"), axis=channel_axis)


FORWARDS = ("relaxed", "hard")


def checked_permutation(value, name="permutation"):
    """`value` as an int64 permutation vector of 0..n-1: integers, not booleans (which
    NumPy sorts as 0 and 1) nor fractions; ValueError naming `name` otherwise."""
    array = np.asarray(None if isinstance(value, (str, bytes, dict)) else value)
    whole = array.dtype.kind in "iu" or (
        array.dtype.kind == "f" and np.all(np.isfinite(array) & (array == np.round(array)))
    )
    if array.dtype == bool or not whole:
        raise ValueError(
            f"`{name}` must be a vector of integers 0..n-1. Received: {name}={str(value)[:200]}"
        )
    return permutations._as_permutation(array.astype(np.int64), name)


def _assignment_int32(matrix):
    return permutations.nearest_permutation(np.asarray(matrix, np.float64)).astype(np.int32)


def nearest_permutation_op(matrix):
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


def _straight_through(matrix):
    """The permutation matrix nearest to `matrix` in the forward pass (exactly: P + (M - M)),
    the identity map to `matrix` in the backward pass."""
    hard = ops.one_hot(nearest_permutation_op(ops.stop_gradient(matrix)), matrix.shape[0])
    hard = ops.cast(hard, matrix.dtype)
    return ops.stop_gradient(hard) + (matrix - ops.stop_gradient(matrix))


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class RelaxedShuffle(keras.layers.Layer):
    """A learned channel shuffle: `y[..., i] = sum_j M[i, j] * x[..., j]`.

    M is an N x N trainable matrix (N = input channels), initialised as |N(0, 1)|
    and projected once, kept doubly stochastic by `DoublyStochastic` after every
    optimizer step, and pushed toward a permutation by the l1-2 penalty
    (`L12Penalty`, reaching the training loss through `layer.losses`).
    `harden()` replaces M by the nearest exact permutation: the layer then
    gathers channels, `y[..., i] = x[..., perm[i]]`, with no weights, no penalty
    and no multiply-adds.

    Args:
        penalty: the paper's lambda, >= 0 (0 is the plain convex relaxation).
        iterations: clip/column/row passes of the constraint per step.
        permutation: an integer permutation to start hardened (used when a
            hardened layer is loaded; users call `harden()` instead).
        data_format: "channels_last" or "channels_first" (default: Keras's).
        seed: seed of the initial matrix.
        initial_groups: None (default) starts M as the paper does, |N(0, 1)| made
            doubly stochastic; an integer g starts M at ShuffleNet's shuffle over g
            groups (`ChannelShuffle(g)`; 1: the identity), so a net built around a
            manual shuffle, pretrained weights included, computes the same function
            before its first step.
        forward: "relaxed" (default, the paper: y = M x) or "hard": y = P x with P the
            nearest permutation of M (linear assignment on the host at every call),
            and the gradient of M taken as if y = M x (straight-through). Training
            and inference then compute an exact permutation; M, its constraint and
            its penalty are trained as in the relaxed form, and `harden()` gives P.

    Example:
        >>> shuffle = RelaxedShuffle(penalty=1e-3)
        >>> y = shuffle(keras.random.normal((2, 8, 8, 12)))
        >>> perm = shuffle.harden()

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(
        self,
        penalty=1e-3,
        iterations=1,
        permutation=None,
        data_format=None,
        seed=None,
        initial_groups=None,
        forward="relaxed",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.forward = _validation.choice(forward, FORWARDS, "forward")
        self.initial_groups = _validation.optional_positive_int(initial_groups, "initial_groups")
        self.regularizer = L12Penalty(_validation.penalty(penalty))
        self.constraint = DoublyStochastic(iterations)
        self.penalty = self.regularizer.strength
        self.iterations = iterations
        self.data_format, self._channel_axis = _channel_axis(data_format)
        self.seed = seed
        self.matrix = None
        self._permutation = (
            None if permutation is None else checked_permutation(permutation, "permutation")
        )

    def build(self, input_shape):
        channels = input_shape[self._channel_axis]
        if channels is None or channels < 1:
            raise ValueError(
                "RelaxedShuffle needs a known channel dimension of at least one channel. "
                f"Received: input_shape={input_shape}"
            )
        if self._permutation is not None:
            if self._permutation.size != channels:
                raise ValueError(
                    f"`permutation` has {self._permutation.size} entries but the input has "
                    f"{channels} channels. Received: input_shape={input_shape}"
                )
            return
        if self.initial_groups is not None and channels % self.initial_groups:
            raise ValueError(
                f"`initial_groups` must divide the {channels} input channels. "
                f"Received: initial_groups={self.initial_groups}"
            )
        # float32 even under mixed precision: the constraint and the penalty need it.
        self.matrix = self.add_weight(
            name="matrix",
            shape=(channels, channels),
            dtype="float32",
            initializer=self._initial_matrix,
            regularizer=self.regularizer if self.penalty > 0 else None,
            constraint=self.constraint,
            trainable=True,
            autocast=False,
        )

    def _initial_matrix(self, shape, dtype=None):
        if self.initial_groups is not None:
            perm = permutations.group_shuffle_permutation(shape[0], self.initial_groups)
            return ops.convert_to_tensor(permutations.permutation_matrix(perm), "float32")
        sample = ops.abs(keras.random.normal(shape, dtype="float32", seed=self.seed))
        return self.constraint(sample)

    def call(self, inputs):
        if self._permutation is not None:
            _check_channels(self, inputs, self._permutation.size)
            return _permute_channels(inputs, self._permutation, self._channel_axis)
        _check_channels(self, inputs, self.matrix.shape[0])
        if not keras.backend.is_float_dtype(inputs.dtype):
            # The matrix cast to an integer dtype would be all zeros.
            raise ValueError(
                f"A relaxed RelaxedShuffle needs floating-point inputs. Received: "
                f"inputs.dtype={keras.backend.standardize_dtype(inputs.dtype)}"
            )
        matrix = self.matrix
        if self.forward == "hard":
            matrix = _straight_through(ops.convert_to_tensor(matrix))
        matrix = ops.cast(matrix, inputs.dtype)
        # tensordot, not an ellipsis einsum: the latter's gradient is ~60x slower on TF CPU.
        if self._channel_axis == -1:
            return ops.tensordot(inputs, matrix, axes=[[-1], [1]])
        return ops.moveaxis(ops.tensordot(matrix, inputs, axes=[[1], [1]]), 0, 1)

    def compute_output_shape(self, input_shape):
        return input_shape

    @property
    def is_hardened(self):
        return self._permutation is not None

    @property
    def permutation(self):
        """The hardened permutation (int vector), or None while relaxed."""
        return None if self._permutation is None else self._permutation.copy()

    def l12_penalty(self):
        """P(M), the l1-2 penalty of the current matrix without lambda (0.0 once hardened)."""
        if self.is_hardened:
            return 0.0
        return float(ops.convert_to_numpy(l12_penalty(self._matrix_numpy())))

    def _matrix_numpy(self):
        # Keras's JAX trainer keeps the variables' values outside them during `fit` (the
        # variables hold None until `model.jax_state_sync()`); reading M then would fail
        # with an obscure TypeError.
        if _keras_internals.has_no_value(self.matrix):
            raise RuntimeError(
                f"The matrix of RelaxedShuffle '{self.name}' has no value attached: during a "
                "JAX `fit` the model holds it. Call `model.jax_state_sync()` first (a "
                "callback's `self.model` does), or use `total_l12_penalty(model)` / "
                "`harden_model(model)`, which do."
            )
        return ops.convert_to_numpy(self.matrix)

    def harden(self, permutation=None):
        """Replaces M by an exact permutation and returns it.

        In a compiled model use `harden_model`, which also keeps the model's optimizer
        and compiled functions consistent (needed to go on training on JAX).

        Args:
            permutation: the permutation to use; default: the nearest one to M
                (linear assignment).
        """
        if self.is_hardened:
            raise ValueError(f"Layer '{self.name}' is already hardened.")
        if not self.built:
            raise ValueError(f"Layer '{self.name}' must be built before it is hardened.")
        matrix = self._matrix_numpy()
        if permutation is None:
            permutation = permutations.nearest_permutation(matrix)
        permutation = checked_permutation(permutation, "permutation")
        if permutation.size != matrix.shape[0]:
            raise ValueError(
                f"`permutation` must have {matrix.shape[0]} entries. "
                f"Received: permutation of size {permutation.size}"
            )
        # Drop the matrix from the layer's state: no weight, no penalty, no MACs.
        _keras_internals.untrack_variable(self, self.matrix)
        self.matrix = None
        self._permutation = permutation
        return permutation.copy()

    def save_own_variables(self, store):
        """A hardened layer writes its permutation (int64) where a relaxed one writes M,
        so weights files and backups carry it, not only the `.keras` config."""
        if self.is_hardened:
            store["permutation"] = self._permutation.astype(np.int64)
        else:
            super().save_own_variables(store)

    def load_own_variables(self, store):
        """Reads M, or a permutation: a relaxed layer given a hardened layer's entry is
        hardened at that permutation (a fresh builder takes a hardened net's weights)."""
        if "permutation" not in store.keys():
            if self.is_hardened and len(store.keys()):
                raise ValueError(
                    f"Layer '{self.name}' is hardened, but the weights file holds a relaxed "
                    "matrix for it. Load it into the relaxed model it was saved from. "
                    f"Received: entries {sorted(store.keys())}"
                )
            if not self.is_hardened:
                super().load_own_variables(store)
            return
        permutation = permutations._as_permutation(store["permutation"], "permutation")
        size = self._permutation.size if self.is_hardened else self.matrix.shape[0]
        if permutation.size != size:
            raise ValueError(
                f"The weights file's permutation for layer '{self.name}' has "
                f"{permutation.size} entries; the layer shuffles {size} channels. "
                f"Received: permutation of size {permutation.size}"
            )
        if self.is_hardened:
            self._permutation = permutation
        else:
            self.harden(permutation)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "penalty": self.penalty,
                "iterations": self.iterations,
                "permutation": None if self._permutation is None else self._permutation.tolist(),
                "data_format": self.data_format,
                "seed": self.seed,
                "initial_groups": self.initial_groups,
                "forward": self.forward,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelShuffle(keras.layers.Layer):
    """ShuffleNet's fixed channel shuffle over `groups` groups.

    Uses rank-4 tensors only (reshape to (batch, pixels, groups, channels // groups),
    swap the last two axes, reshape back): 5-D transposes break LiteRT delegates.
    `permutation` reports the same shuffle as an index vector, so manual and
    learned shuffles share code downstream.

    Args:
        groups: number of channel groups, a positive integer dividing the channels.
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Reference:
        Zhang et al., ShuffleNet, https://arxiv.org/abs/1707.01083
    """

    def __init__(self, groups, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.groups = _validation.positive_int(groups, "groups")
        self.data_format, self._channel_axis = _channel_axis(data_format)
        self.channels = None

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"ChannelShuffle expects a rank-4 input. Received: input_shape={input_shape}"
            )
        channels = input_shape[self._channel_axis]
        if channels is None or channels % self.groups:
            raise ValueError(
                f"The channel count must be known and divisible by groups={self.groups}. "
                f"Received: input_shape={input_shape}"
            )
        self.channels = channels

    def call(self, inputs):
        g, c = self.groups, self.channels
        # -1 for the batch and the static spatial sides where known: LiteRT then gets
        # constant shapes and no SHAPE op, which XNNPACK cannot take (measured: a v2 1.0x
        # graph cut into 17 delegate partitions).
        shape = ops.shape(inputs)
        if self._channel_axis == -1:
            x = ops.reshape(inputs, (-1, shape[1] * shape[2], g, c // g))
            x = ops.transpose(x, (0, 1, 3, 2))
            return ops.reshape(x, (-1, shape[1], shape[2], c))
        x = ops.reshape(inputs, (-1, g, c // g, shape[2] * shape[3]))
        x = ops.transpose(x, (0, 2, 1, 3))
        return ops.reshape(x, (-1, c, shape[2], shape[3]))

    def compute_output_shape(self, input_shape):
        return input_shape

    @property
    def permutation(self):
        """The shuffle as `perm` with `y[..., i] = x[..., perm[i]]` (needs the layer built)."""
        if self.channels is None:
            raise ValueError(f"Layer '{self.name}' must be built to know its permutation.")
        return permutations.group_shuffle_permutation(self.channels, self.groups)

    def get_config(self):
        config = super().get_config()
        config.update({"groups": self.groups, "data_format": self.data_format})
        return config


def shuffle_layers(model):
    """The model's RelaxedShuffle and ChannelShuffle layers in order, nested models included."""
    found = []
    for layer in model.layers if hasattr(model, "layers") else []:
        if isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(shuffle_layers(layer))
    return found


def shuffle_permutation(layer):
    """The permutation of a ChannelShuffle or a hardened RelaxedShuffle (int64 vector)."""
    if isinstance(layer, RelaxedShuffle) and not layer.is_hardened:
        raise ValueError(
            f"Shuffle '{layer.name}' is still relaxed: harden the model first "
            "(keras_autoshuffle.harden_model)."
        )
    if not isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
        raise ValueError(f"Layer '{layer.name}' is not a shuffle layer.")
    return np.asarray(layer.permutation, dtype=np.int64)


def relaxed_shuffles(model):
    """The model's RelaxedShuffle layers that are still relaxed, in order."""
    return [
        layer
        for layer in shuffle_layers(model)
        if isinstance(layer, RelaxedShuffle) and not layer.is_hardened
    ]


def total_l12_penalty(model):
    """sum_j P(M_j), the l1-2 penalties of the model's relaxed shuffles without lambda.

    Works between the steps of a `fit` on every backend (e.g. from a callback).
    """
    attach_state(model)
    return float(np.sum([layer.l12_penalty() for layer in relaxed_shuffles(model)] or [0.0]))


def attach_state(model):
    """Puts the values Keras's JAX trainer holds outside the variables during `fit` back
    into them (no-op elsewhere), so the model's weights can be read between steps."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelSplit(keras.layers.Layer):
    """Splits the channel axis into two halves: ShuffleNet v2's channel split.

    Args:
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        A list `[first_half, second_half]`.

    Reference:
        Ma et al., ShuffleNet V2, https://arxiv.org/abs/1807.11164
    """

    def __init__(self, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.data_format, self._axis = _channel_axis(data_format)

    def build(self, input_shape):
        channels = input_shape[self._axis]
        if channels is None or channels % 2:
            raise ValueError(
                "ChannelSplit needs a known, even channel count. "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs):
        return ops.split(inputs, 2, axis=self._axis)

    def compute_output_shape(self, input_shape):
        half = list(input_shape)
        half[self._axis] = input_shape[self._axis] // 2
        return [tuple(half), tuple(half)]

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelSlice(keras.layers.Layer):
    """Contiguous channels `inputs[..., start:stop]` (channels_last): a LiteRT SLICE.

    Args:
        start: first channel, a non-negative integer.
        stop: one past the last channel, greater than `start`.
    """

    def __init__(self, start, stop, **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
            raise ValueError(
                "`start` and `stop` must be integers with 0 <= start < stop. "
                f"Received: start={start}, stop={stop}"
            )
        self.start, self.stop = start, stop

    def build(self, input_shape):
        if input_shape[-1] is None or input_shape[-1] < self.stop:
            raise ValueError(
                f"ChannelSlice(stop={self.stop}) needs at least {self.stop} channels. "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs):
        return inputs[..., self.start : self.stop]

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.stop - self.start)

    def get_config(self):
        return {**super().get_config(), "start": self.start, "stop": self.stop}


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class GroupedConv2D(layers.Conv2D):
    """`keras.layers.Conv2D` whose grouped convolutions train fast on TensorFlow CPUs.

    On the TensorFlow backend Keras runs every grouped convolution through XLA, since
    TF's CPU kernels have no gradient for it (without oneDNN they raise): a ShuffleNet
    v1 g=3 training step took 4x as long as with the native kernel. Here the forward
    pass is TF's native grouped convolution (also what SavedModel and LiteRT get) and,
    without a GPU, its gradient is that of the same convolution computed group by group.
    Same arguments, weights and config as Conv2D; other backends use Conv2D's path.
    """

    def convolution_op(self, inputs, kernel):
        if (
            self.groups == 1
            or keras.backend.backend() != "tensorflow"
            or self.data_format != "channels_last"
        ):
            return super().convolution_op(inputs, kernel)
        return _tf_grouped_conv(
            inputs, kernel, self.strides, self.padding.upper(), self.dilation_rate, self.groups
        )


def _tf_grouped_conv(inputs, kernel, strides, padding, dilations, groups):
    import tensorflow as tf

    def native(x, k):
        return tf.nn.convolution(x, k, strides, padding, dilations=dilations)

    if tf.config.list_logical_devices("GPU"):
        return native(inputs, kernel)  # cuDNN has the gradient

    @tf.custom_gradient
    def grouped(x, k):
        def gradient(upstream):
            with tf.GradientTape() as tape:
                tape.watch([x, k])
                pieces = zip(tf.split(x, groups, -1), tf.split(k, groups, -1), strict=True)
                y = tf.concat([native(a, b) for a, b in pieces], axis=-1)
            return tape.gradient(y, [x, k], output_gradients=upstream)

        return native(x, k), gradient

    # Read the variable outside: custom_gradient then sees tensors only.
    return grouped(inputs, tf.convert_to_tensor(kernel))
