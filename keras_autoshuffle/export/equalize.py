"""Cross-layer range equalization before int8: the same function, with the per-channel
ranges of the tensors int8 quantizes per tensor made equal.

An int8 file quantizes each weight per output channel but each activation per tensor:
one scale for all of a tensor's channels, set by its largest. A channel whose values span
a quarter of that range keeps a quarter of the levels. Where a BatchNormalization's
output reaches a convolution only through a ReLU and zero padding (which commute with a
positive per-channel scale), the BatchNormalization can divide channel `c` by `s_c` and
the convolution multiply its input channel `c` by `s_c`: the float function is unchanged.
`equalize_ranges` chooses `s_c` as the channel's range on the calibration images over the
tensor's largest, so every channel of that tensor spans the same range (Nagel et al.,
"Data-Free Quantization Through Weight Equalization and Bias Correction", ICCV 2019, Sec.
4.1, with the ranges measured as SmoothQuant does, its migration strength at 1).

In a ShuffleNet v2 branch (1x1 conv, BN, ReLU, 3x3 depthwise, BN, 1x1 conv, BN, ReLU)
that is the ReLU's output before the depthwise convolution, at no cost (the depthwise
kernel is quantized per channel), and the depthwise output before the second 1x1 conv,
whose per-output-channel weight ranges then carry the spread instead. Measured:
docs/lab-notes/inference.md, "Equal channel ranges before int8".
"""

import keras
import numpy as np

from keras_autoshuffle._keras_internals import inbound_nodes, producing_layer

# Channels whose range is below this fraction of the tensor's largest are left as they
# are (a channel dead on the calibration images would otherwise be scaled without bound).
_MIN_RELATIVE_RANGE = 1e-3
_BATCH = 64


def equalize_ranges(model: keras.Model, images: np.ndarray) -> keras.Model:
    """A copy of `model` computing the same function (within float rounding), in which
    each tensor between a BatchNormalization and the convolution that alone reads it has
    equal per-channel ranges (max |x|) on `images`.

    Matched: BatchNormalization (with its scale and offset), then optionally ReLU (no
    `max_value`, threshold 0) and ZeroPadding2D, read only by a Conv2D of one group or a
    DepthwiseConv2D of depth multiplier 1. Nested functional models (a folded net behind
    an input normalization) are equalized on the inputs they receive. `model` is not
    changed; a Sequential model, or one holding a Lambda layer, is returned as it is.

    Args:
        model: a single-input functional Keras model, e.g. a folded ShuffleNet.
        images: float32 inputs to measure the ranges on (the int8 calibration images).

    Returns:
        The equalized copy.
    """
    # A Sequential model has no `operations` graph to walk, and a Lambda's Python function
    # is not copied from its config (Keras's safe mode): such a model is returned as it is.
    if not _walkable(model) or len(model.inputs) != 1:
        return model
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    _equalize(copy, np.asarray(images, dtype="float32"))
    return copy


def _walkable(model):
    return hasattr(model, "operations") and all(
        _walkable(op) if isinstance(op, keras.Model) else not isinstance(op, keras.layers.Lambda)
        for op in model.operations
    )


def _equalize(model, images):
    for op in model.operations:  # nested models first, on what reaches them
        if isinstance(op, keras.Model):
            (inner,) = _channel_values(model, [inbound_nodes(op)[0].input_tensors[0]], images, None)
            _equalize(op, inner)
    chains = _chains(model)
    if not chains:
        return
    taps = [inbound_nodes(consumer)[0].input_tensors[0] for _, consumer in chains]
    ranges_per_chain = _channel_values(model, taps, images, (1, 2))
    for (norm, consumer), ranges in zip(chains, ranges_per_chain, strict=True):
        largest = float(np.max(ranges))
        live = ranges > _MIN_RELATIVE_RANGE * largest
        if largest <= 0 or not np.all(np.isfinite(ranges)):
            continue
        scale = np.where(live, ranges / largest, 1.0).astype("float32")
        gamma, beta = norm.gamma, norm.beta
        gamma.assign(gamma.numpy() / scale)
        beta.assign(beta.numpy() / scale)
        kernel = consumer.kernel  # (h, w, input channels, outputs or depth multiplier)
        kernel.assign(kernel.numpy() * scale[None, None, :, None])


def _readers(model):
    readers = {}
    for op in model.operations:
        for node in inbound_nodes(op):
            for tensor in node.input_tensors:
                readers.setdefault(id(producing_layer(tensor)), []).append(op)
    return readers


def _chains(model):
    """[(BatchNormalization, the convolution that alone reads it)] in `model`'s own graph."""
    readers = _readers(model)
    chains = []
    for norm in model.operations:
        if not (isinstance(norm, keras.layers.BatchNormalization) and norm.scale and norm.center):
            continue
        if len(inbound_nodes(norm)) != 1:
            continue
        op = norm
        while True:
            after = readers.get(id(op), [])
            if len(after) != 1 or len(inbound_nodes(after[0])) != 1:
                break
            op = after[0]
            if not _commutes(op):
                break
        if _scalable_input(op):
            chains.append((norm, op))
    return chains


def _commutes(op):
    """Whether `op` commutes with a positive per-channel scale."""
    if isinstance(op, keras.layers.ZeroPadding2D):
        return True
    return isinstance(op, keras.layers.ReLU) and op.max_value is None and float(op.threshold) == 0.0


def _scalable_input(op):
    """Whether `op`'s kernel can take a per-input-channel scale (its axis 2)."""
    if isinstance(op, keras.layers.DepthwiseConv2D):
        return op.depth_multiplier == 1 and op.data_format == "channels_last"
    return (
        isinstance(op, keras.layers.Conv2D) and op.groups == 1 and op.data_format == "channels_last"
    )


def _channel_values(model, tensors, images, axes):
    """Each of `tensors` on `images` (`axes` None), or its max |x| per channel over the
    images and `axes`."""
    probe = keras.Model(
        model.inputs[0],
        [t if axes is None else keras.ops.max(keras.ops.abs(t), axis=axes) for t in tensors],
    )
    parts = [[] for _ in tensors]
    for start in range(0, len(images), _BATCH):
        outputs = probe(images[start : start + _BATCH], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        for part, output in zip(parts, outputs, strict=True):
            part.append(keras.ops.convert_to_numpy(output))
    values = [np.concatenate(part) for part in parts]
    return values if axes is None else [np.max(v, axis=0) for v in values]
