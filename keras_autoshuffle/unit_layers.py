"""The fixed layers of ShuffleNet units, registered for `.keras` files on import.

ShuffleNet's channel shuffle (`ChannelShuffle`), the channel split of ShuffleNet v2
(`ChannelSplit`), the contiguous slice folding uses (`ChannelSlice`) and
`GroupedConv2D`, a Conv2D whose grouped form trains fast on TF CPUs. The learned shuffle
is in `keras_autoshuffle.layers`, which exports these too (their registered names did
not change when they moved here: files saved before load).
"""

from typing import Any, Literal

import keras
import numpy as np
from keras import layers, ops

from keras_autoshuffle import _validation, permutations


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

    def __init__(
        self,
        groups: int,
        data_format: Literal["channels_last", "channels_first"] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.groups = _validation.positive_int(groups, "groups")
        self.data_format = _validation.data_format(data_format)
        self._channel_axis = _validation.channel_axis(self.data_format)
        self.channels = None

    def build(self, input_shape: tuple[int | None, ...]) -> None:
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

    def call(self, inputs: Any) -> Any:
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

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return input_shape

    @property
    def permutation(self) -> np.ndarray:
        """The shuffle as `perm` with `y[..., i] = x[..., perm[i]]` (needs the layer built)."""
        if self.channels is None:
            raise ValueError(f"Layer '{self.name}' must be built to know its permutation.")
        return permutations.group_shuffle_permutation(self.channels, self.groups)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "groups": self.groups, "data_format": self.data_format}


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelSplit(keras.layers.Layer):
    """Splits the channel axis into two halves: ShuffleNet v2's channel split.

    Called on a tensor, it returns the list `[first_half, second_half]`.

    Args:
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Reference:
        Ma et al., ShuffleNet V2, https://arxiv.org/abs/1807.11164
    """

    def __init__(
        self,
        data_format: Literal["channels_last", "channels_first"] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.data_format = _validation.data_format(data_format)
        self._axis = _validation.channel_axis(self.data_format)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        channels = input_shape[self._axis]
        if channels is None or channels % 2:
            raise ValueError(
                "ChannelSplit needs a known, even channel count. "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs: Any) -> Any:
        return ops.split(inputs, 2, axis=self._axis)

    def compute_output_shape(
        self, input_shape: tuple[int | None, ...]
    ) -> list[tuple[int | None, ...]]:
        half = list(input_shape)
        half[self._axis] = input_shape[self._axis] // 2
        return [tuple(half), tuple(half)]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "data_format": self.data_format}


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelSlice(keras.layers.Layer):
    """Contiguous channels `inputs[..., start:stop]` (channels_last): a LiteRT SLICE.

    Args:
        start: first channel, a non-negative integer.
        stop: one past the last channel, greater than `start`.
    """

    def __init__(self, start: int, stop: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not (_validation.is_integer(start) and _validation.is_integer(stop)) or not (
            0 <= start < stop
        ):
            raise ValueError(
                "`start` and `stop` must be integers with 0 <= start < stop. "
                f"Received: start={start!r}, stop={stop!r}"
            )
        self.start, self.stop = int(start), int(stop)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        if input_shape[-1] is None or input_shape[-1] < self.stop:
            raise ValueError(
                f"ChannelSlice(stop={self.stop}) needs at least {self.stop} channels. "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs: Any) -> Any:
        return inputs[..., self.start : self.stop]

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return (*input_shape[:-1], self.stop - self.start)

    def get_config(self) -> dict[str, Any]:
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

    def convolution_op(self, inputs: Any, kernel: Any) -> Any:

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
