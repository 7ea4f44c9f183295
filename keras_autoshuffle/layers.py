"""The learned shuffle `RelaxedShuffle`, registered for `.keras` files on import, and the
functions that find a model's shuffles (learned or fixed) and read their state.

Every custom layer is importable from here: the fixed layers of ShuffleNet units
(`ChannelShuffle`, `ChannelSplit`, `ChannelSlice`, `GroupedConv2D`) live in
`keras_autoshuffle.unit_layers`, the hard forward pass in `keras_autoshuffle.hard_forward`.
"""

from collections.abc import Sequence
from typing import Any, Literal

import keras
import numpy as np
from keras import ops

from keras_autoshuffle import _keras_internals, _validation, permutations
from keras_autoshuffle.constraints import SINKHORN_ITERATIONS, DoublyStochastic
from keras_autoshuffle.hard_forward import FORWARDS, nearest_permutation_op, straight_through
from keras_autoshuffle.regularizers import L12Penalty, l12_penalty
from keras_autoshuffle.unit_layers import ChannelShuffle, ChannelSlice, ChannelSplit, GroupedConv2D

__all__ = [
    "FORWARDS",
    "SHUFFLE_INITIALIZERS",
    "ChannelShuffle",
    "ChannelSlice",
    "ChannelSplit",
    "GroupedConv2D",
    "RelaxedShuffle",
    "attach_state",
    "checked_permutation",
    "nearest_permutation_op",
    "relaxed_shuffles",
    "shuffle_layers",
    "shuffle_permutation",
    "total_l12_penalty",
]

# Where a learned matrix starts (the builders' `shuffle_initializer` takes the same values).
SHUFFLE_INITIALIZERS = ("random", "manual")


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


def checked_permutation(value: Any, name: str = "permutation") -> np.ndarray:
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


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class RelaxedShuffle(keras.layers.Layer):
    """A learned channel shuffle: `y[..., i] = sum_j M[i, j] * x[..., j]`.

    M is an N x N trainable matrix (N = input channels), initialised as |N(0, 1)|
    passed once through its constraint, kept doubly stochastic by `DoublyStochastic`
    (`sinkhorn_iterations` passes) after every optimizer step, and pushed toward a
    permutation by the l1-2 penalty (`L12Penalty`, reaching the training loss through
    `layer.losses`).
    `harden()` replaces M by the nearest exact permutation: the layer then
    gathers channels, `y[..., i] = x[..., perm[i]]`, with no weights, no penalty
    and no multiply-adds.

    Args:
        penalty: the paper's lambda, >= 0 (0 is the plain convex relaxation).
        sinkhorn_iterations: clip/column/row passes of the constraint per step, an
            integer in [1, 1000] (default 10, as the builders; 1 is the paper's
            Algorithm 1, which stalled short of permutations; see `DoublyStochastic`).
        permutation: an integer permutation to start hardened (used when a
            hardened layer is loaded; users call `harden()` instead).
        data_format: "channels_last" or "channels_first" (default: Keras's).
        seed: seed of the initial matrix.
        shuffle_initializer: where M starts, as the builders' argument of that name:
            "random" (default, the paper: |N(0, 1)| made doubly stochastic) or
            "manual": ShuffleNet's shuffle over `groups` groups (`ChannelShuffle(groups)`;
            1: the identity), so a net built around a manual shuffle, pretrained
            weights included, computes the same function before its first step.
        groups: with `shuffle_initializer="manual"`, the groups of that shuffle, a
            positive integer dividing the channels; None otherwise.
        forward: "relaxed" (default, the paper: y = M x) or "hard": y = P x with P the
            nearest permutation of M (linear assignment on the host at every call),
            and the gradient of M taken as if y = M x (straight-through). Training
            and inference then compute an exact permutation; M, its constraint and
            its penalty are trained as in the relaxed form, and `harden()` gives P.
            The attribute is `forward_pass` (on the torch backend `forward` is
            torch.nn.Module's call).

    Example:
        >>> shuffle = RelaxedShuffle(penalty=1e-3)
        >>> y = shuffle(keras.random.normal((2, 8, 8, 12)))
        >>> perm = shuffle.harden()

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """

    def __init__(
        self,
        penalty: float = 1e-3,
        sinkhorn_iterations: int = SINKHORN_ITERATIONS,
        permutation: Sequence[int] | np.ndarray | None = None,
        data_format: Literal["channels_last", "channels_first"] | None = None,
        seed: int | None = None,
        shuffle_initializer: Literal["random", "manual"] = "random",
        groups: int | None = None,
        forward: Literal["relaxed", "hard"] = "relaxed",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Not `self.forward`: on the torch backend that name is torch.nn.Module.forward.
        self.forward_pass = _validation.choice(forward, FORWARDS, "forward")
        self.shuffle_initializer = _validation.choice(
            shuffle_initializer, SHUFFLE_INITIALIZERS, "shuffle_initializer"
        )
        self.groups = _validation.optional_positive_int(groups, "groups")
        if (shuffle_initializer == "manual") != (self.groups is not None):
            raise ValueError(
                "`groups` (of the manual shuffle M starts at) is needed with "
                'shuffle_initializer="manual" and only there. Received: '
                f"shuffle_initializer={shuffle_initializer!r}, groups={groups!r}"
            )
        self.regularizer = L12Penalty(_validation.penalty(penalty))
        self.constraint = DoublyStochastic(sinkhorn_iterations)
        self.penalty = self.regularizer.penalty
        self.sinkhorn_iterations = self.constraint.sinkhorn_iterations
        self.data_format = _validation.data_format(data_format)
        self._channel_axis = _validation.channel_axis(self.data_format)
        self.seed = seed
        self.matrix = None
        self._permutation = (
            None if permutation is None else checked_permutation(permutation, "permutation")
        )

    def build(self, input_shape: tuple[int | None, ...]) -> None:
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
        if self.groups is not None and channels % self.groups:
            raise ValueError(
                f"`groups` must divide the {channels} input channels. "
                f"Received: groups={self.groups}"
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
        if self.groups is not None:
            perm = permutations.group_shuffle_permutation(shape[0], self.groups)
            return ops.convert_to_tensor(permutations.permutation_matrix(perm), "float32")
        sample = ops.abs(keras.random.normal(shape, dtype="float32", seed=self.seed))
        return self.constraint(sample)

    def call(self, inputs: Any) -> Any:
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
        if self.forward_pass == "hard":
            matrix = straight_through(ops.convert_to_tensor(matrix))
        matrix = ops.cast(matrix, inputs.dtype)
        # tensordot, not an ellipsis einsum: the latter's gradient is ~60x slower on TF CPU.
        if self._channel_axis == -1:
            return ops.tensordot(inputs, matrix, axes=[[-1], [1]])
        return ops.moveaxis(ops.tensordot(matrix, inputs, axes=[[1], [1]]), 0, 1)

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return input_shape

    @property
    def is_hardened(self) -> bool:
        return self._permutation is not None

    @property
    def permutation(self) -> np.ndarray | None:
        """The hardened permutation (int vector), or None while relaxed."""
        return None if self._permutation is None else self._permutation.copy()

    def l12_penalty(self) -> float:
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

    def harden(self, permutation: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
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

    def save_own_variables(self, store: Any) -> None:
        """A hardened layer writes its permutation (int64) where a relaxed one writes M,
        so weights files and backups carry it, not only the `.keras` config."""
        if self.is_hardened:
            store["permutation"] = self._permutation.astype(np.int64)
        else:
            super().save_own_variables(store)

    def load_own_variables(self, store: Any) -> None:
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

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "penalty": self.penalty,
            "sinkhorn_iterations": self.sinkhorn_iterations,
            "permutation": None if self._permutation is None else self._permutation.tolist(),
            "data_format": self.data_format,
            "seed": self.seed,
            "shuffle_initializer": self.shuffle_initializer,
            "groups": self.groups,
            "forward": self.forward_pass,
        }


def shuffle_layers(model: keras.Model) -> list[RelaxedShuffle | ChannelShuffle]:
    """The model's RelaxedShuffle and ChannelShuffle layers in order, nested models included."""
    found = []
    for layer in model.layers if hasattr(model, "layers") else []:
        if isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(shuffle_layers(layer))
    return found


def shuffle_permutation(layer: RelaxedShuffle | ChannelShuffle) -> np.ndarray:
    """The permutation of a ChannelShuffle or a hardened RelaxedShuffle (int64 vector)."""
    if isinstance(layer, RelaxedShuffle) and not layer.is_hardened:
        raise ValueError(
            f"Shuffle '{layer.name}' is still relaxed: harden the model first "
            "(keras_autoshuffle.harden_model)."
        )
    if not isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
        raise ValueError(f"Layer '{layer.name}' is not a shuffle layer.")
    return np.asarray(layer.permutation, dtype=np.int64)


def relaxed_shuffles(model: keras.Model) -> list[RelaxedShuffle]:
    """The model's RelaxedShuffle layers that are still relaxed, in order."""
    return [
        layer
        for layer in shuffle_layers(model)
        if isinstance(layer, RelaxedShuffle) and not layer.is_hardened
    ]


def total_l12_penalty(model: keras.Model) -> float:
    """sum_j P(M_j), the l1-2 penalties of the model's relaxed shuffles without lambda.

    Works between the steps of a `fit` on every backend (e.g. from a callback).
    """
    attach_state(model)
    return float(np.sum([layer.l12_penalty() for layer in relaxed_shuffles(model)] or [0.0]))


def attach_state(model: keras.Model) -> None:
    """Puts the values Keras's JAX trainer holds outside the variables during `fit` back
    into them (no-op elsewhere), so the model's weights can be read between steps."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()
