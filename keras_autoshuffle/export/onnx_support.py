"""The layers `onnx_graph` writes, and why it cannot write another (`unsupported_layers`):
a kind it has no op for, settings it does not translate (dilation, a clipped ReLU,
channels-first data), or tensors whose ranks or sides the NCHW graph would get wrong.
"""

import keras

from keras_autoshuffle._keras_internals import inbound_nodes
from keras_autoshuffle.layers import RelaxedShuffle
from keras_autoshuffle.unit_layers import ChannelShuffle, ChannelSlice, ChannelSplit

ACTIVATIONS = {"linear": None, "relu": "Relu", "softmax": "Softmax", "sigmoid": "Sigmoid"}
CONVS = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)
POOLS = (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D)
LAYERS = (
    *CONVS,
    keras.layers.BatchNormalization,
    keras.layers.ReLU,
    keras.layers.ZeroPadding2D,
    *POOLS,
    keras.layers.GlobalAveragePooling2D,
    keras.layers.Dense,
    keras.layers.Concatenate,
    keras.layers.Add,
    keras.layers.Identity,
    keras.layers.Activation,
    keras.layers.InputLayer,
    ChannelSplit,
    ChannelSlice,
    ChannelShuffle,
    RelaxedShuffle,
)


def activation_name(layer: keras.layers.Layer) -> str:
    """The name of `layer`'s activation function (`"linear"` when it has none)."""
    return getattr(getattr(layer, "activation", None), "__name__", "linear")


def _why_unsupported(layer):
    """Why `onnx_graph` cannot write `layer` (its kind or settings), or None."""
    if not isinstance(layer, LAYERS) or len(inbound_nodes(layer)) != 1:
        return type(layer).__name__
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return f"{type(layer).__name__}(data_format={layer.data_format})"
    if isinstance(layer, RelaxedShuffle) and not layer.is_hardened:
        return "RelaxedShuffle (relaxed: harden it first)"
    if activation_name(layer) not in ACTIVATIONS:
        return f"{type(layer).__name__}(activation={activation_name(layer)})"
    if isinstance(layer, CONVS) and tuple(layer.dilation_rate) != (1, 1):
        return f"{type(layer).__name__}(dilation_rate={layer.dilation_rate})"
    if isinstance(layer, keras.layers.ReLU) and (
        layer.max_value is not None or layer.negative_slope != 0 or layer.threshold != 0
    ):
        return "ReLU(max_value, negative_slope or threshold set)"
    if isinstance(layer, keras.layers.GlobalAveragePooling2D) and layer.keepdims:
        return "GlobalAveragePooling2D(keepdims=True)"
    node = inbound_nodes(layer)[0]
    return _why_unsupported_on(layer, node) if node.input_tensors else None  # InputLayer


def _why_unsupported_on(layer, node):
    """Why `onnx_graph` cannot write `layer` on the tensors of its call `node`, or None:
    ranks and axes the NCHW graph would get wrong, sizes it needs and does not know."""
    kind, rank = type(layer).__name__, node.input_tensors[0].ndim
    if isinstance(layer, keras.layers.Concatenate | ChannelSplit) and rank not in (2, 4):
        return f"{kind} of rank other than 2 or 4"
    if isinstance(layer, keras.layers.Dense) and rank != 2:
        return "Dense on a rank other than 2"
    if activation_name(layer) == "softmax" and node.output_tensors[0].ndim != 2:
        # Keras's is over the NHWC channels; the NCHW graph's last axis is the width.
        rank_out = node.output_tensors[0].ndim
        return f"{kind}(activation=softmax) of rank {rank_out} (written: a 2-D one's last axis)"
    if isinstance(layer, keras.layers.BatchNormalization) and (rank != 4 or layer.axis % 4 != 3):
        # Written as a scale and a shift of shape (channels, 1, 1): the NCHW channels.
        return f"BatchNormalization(axis={layer.axis}) of rank {rank} (written: 4-D channels)"
    sides = node.input_tensors[0].shape[1:3]
    needs_sides = isinstance(layer, ChannelShuffle) or (
        isinstance(layer, CONVS + POOLS) and layer.padding == "same"
    )
    if needs_sides and None in sides:
        # ChannelShuffle's last Reshape and TensorFlow's 'same' pads need them.
        return f"{kind} on unknown spatial sides {tuple(sides)}"
    return None


def unsupported_layers(model: keras.Model) -> list[str]:
    """Names and kinds of `model`'s layers `onnx_graph` cannot write (empty: all can)."""
    found = []
    for layer in model.operations:
        why = _why_unsupported(layer)
        if why:
            found.append(f"{layer.name}: {why}")
    if len(model.inputs) != 1 or model.inputs[0].ndim != 4:
        found.append("the model: not a single 4-D (NHWC image) input")
    return found
