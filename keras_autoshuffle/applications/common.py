"""Pieces shared by the ShuffleNet v1 / v2 builders: argument checks, input handling,
the layer factories, the classifier head, `preprocess_input` and the multiply-add counter.
The custom layers themselves live in `keras_autoshuffle.layers`."""

import dataclasses
import functools
import inspect
import os
import zipfile

import keras
import numpy as np
from keras import layers, ops

from keras_autoshuffle import _keras_internals, _validation
from keras_autoshuffle.constraints import check_iterations
from keras_autoshuffle.layers import ChannelShuffle, GroupedConv2D, RelaxedShuffle

SHUFFLES = ("manual", "auto")
STEMS = ("imagenet", "cifar", "auto")
POOLINGS = (None, "avg", "max")
# "auto" picks the CIFAR stem when both spatial sides are at most this.
CIFAR_MAX_SIDE = 64
# Total stride of the network for each stem: the smallest accepted input side.
MIN_SIZE = {"imagenet": 32, "cifar": 8}

# torchvision's ImageNet statistics (inputs scaled to [0, 1] first).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def channel_axis():
    """The channel axis of an image tensor for Keras's current `image_data_format()`."""
    return -1 if keras.config.image_data_format() == "channels_last" else 1


def batch_norm(name, gamma_initializer="ones"):
    """BatchNormalization as PyTorch trains ShuffleNets (momentum 0.1 there, 0.9 here).

    Keras's default momentum of 0.99 leaves the moving statistics far behind the
    weights during short trainings: evaluation accuracy stays at chance.
    """
    return layers.BatchNormalization(
        axis=channel_axis(),
        momentum=0.9,
        epsilon=1e-5,
        gamma_initializer=gamma_initializer,
        name=name,
    )


PADDINGS = ("torch", "same")


def _pad(x, strides, name, padding):
    """Pads `x` for the 3x3 layer `name`; returns `(x, padding)` for that layer.

    "torch": PyTorch's padding=1. At stride 1 Keras's 'same' already pads one pixel on
    each side. At stride 2 'same' pads one pixel at the bottom/right only on an even
    side (on an odd side, one on each side), a grid shifted by one pixel from PyTorch's,
    so torchvision's weights would give other logits: a stride-2 layer gets an explicit
    one-pixel ZeroPadding2D (`<name>_pad`) and 'valid', as keras.applications does
    (ResNet's `conv1_pad`). "same": Keras's 'same' everywhere (no PAD ops in LiteRT).
    """
    if strides == 1 or padding == "same":
        return x, "same"
    return layers.ZeroPadding2D(1, name=f"{name}_pad")(x), "valid"


def conv(filters, kernel_size, name, strides=1, groups=1, padding="torch"):
    """A bias-free convolution (1x1, or 3x3 padded as `_pad`)."""

    def apply(x):
        x, mode = _pad(x, strides, name, padding)
        return GroupedConv2D(
            filters,
            kernel_size,
            strides=strides,
            padding=mode,
            groups=groups,
            use_bias=False,
            name=name,
        )(x)

    return apply


def dwconv(strides, name, padding="torch"):
    """A bias-free 3x3 depthwise convolution padded as `_pad`."""

    def apply(x):
        x, mode = _pad(x, strides, name, padding)
        return layers.DepthwiseConv2D(3, strides=strides, padding=mode, use_bias=False, name=name)(
            x
        )

    return apply


def pool(kind, name, padding="torch"):
    """A 3x3 stride-2 max or average pool padded as `_pad`.

    With "torch" the zeros stand in for PyTorch's padding: for the max-pool (after a
    ReLU, inputs >= 0) they never win over a real pixel, and the average-pool divides by
    9 at the border too, as PyTorch's AvgPool2d (count_include_pad=True, megvii's v1
    shortcut). TF's 'same' average-pool divides by the pixels inside the image.
    """
    pooling = {"max": layers.MaxPooling2D, "avg": layers.AveragePooling2D}[kind]

    def apply(x):
        x, mode = _pad(x, 2, name, padding)
        return pooling(3, strides=2, padding=mode, name=name)(x)

    return apply


SHUFFLE_INITIALIZERS = ("random", "manual")
SHUFFLE_FORWARDS = ("relaxed", "hard")


@dataclasses.dataclass(frozen=True)
class Options:
    """The checked builder arguments that shape every unit."""

    shuffle: str  # "manual" or "auto"
    penalty: float
    shuffle_initializer: str  # "random" or "manual": where a learned matrix starts
    padding: str  # "torch" or "same"
    sinkhorn_iterations: int  # constraint passes per step of a learned shuffle
    forward: str = "relaxed"  # "relaxed" (M x) or "hard" (nearest permutation, straight-through)
    permutations: dict | None = None  # {shuffle name: permutation}: fixed from the first step

    def shuffle_layer(self, groups, name):
        """ChannelShuffle(groups) for "manual"; a RelaxedShuffle for "auto", started at
        that same shuffle when `shuffle_initializer` is "manual", or hardened at
        `permutations[name]` when permutations are given."""
        data_format = keras.config.image_data_format()
        if self.shuffle == "auto":
            fixed = None
            if self.permutations is not None:
                if name not in self.permutations:
                    raise ValueError(
                        f"`shuffle_permutations` has no entry for the shuffle layer {name!r}. "
                        f"Received: keys {sorted(self.permutations)}"
                    )
                fixed = self.permutations[name]
            start = groups if self.shuffle_initializer == "manual" else None
            return RelaxedShuffle(
                penalty=self.penalty,
                iterations=self.sinkhorn_iterations,
                data_format=data_format,
                initial_groups=start,
                permutation=fixed,
                forward=self.forward,
                name=name,
            )
        return ChannelShuffle(groups, data_format=data_format, name=name)

    def check_permutations_used(self, model):
        """Refuses `shuffle_permutations` entries that name no shuffle layer of `model`."""
        if self.permutations is None:
            return
        names = {layer.name for layer in model.layers if isinstance(layer, RelaxedShuffle)}
        unused = sorted(set(self.permutations) - names)
        if unused:
            raise ValueError(
                f"`shuffle_permutations` names layers the model does not have as shuffles: "
                f"{unused}. Received: keys {sorted(self.permutations)}"
            )

    def conv(self, filters, kernel_size, name, strides=1, groups=1):
        return conv(filters, kernel_size, name, strides, groups, self.padding)

    def dwconv(self, strides, name):
        return dwconv(strides, name, self.padding)

    def pool(self, kind, name):
        return pool(kind, name, self.padding)


@functools.cache
def channels_first_supported():
    """Whether the backend runs channels_first convolutions on this machine (probed once).

    TensorFlow's CPU Conv2D kernel takes NCHW only when TensorFlow runs with oneDNN
    (on by default on x86 CPUs with AVX-512); elsewhere a channels_first model builds
    and then fails at its first call (`UnimplementedError: The Conv2D op currently only
    supports the NHWC tensor format on the CPU`). So a 1x1 convolution on a tiny input
    is tried. Other backends (JAX, PyTorch) run channels_first anywhere.
    """
    if keras.backend.backend() != "tensorflow":
        return True
    import tensorflow as tf

    try:
        with tf.init_scope():  # run eagerly even when called inside a tf.function
            ops.conv(tf.ones((1, 2, 3, 3)), tf.ones((1, 1, 2, 2)), data_format="channels_first")
    except tf.errors.OpError:
        return False
    return True


def check_image_data_format():
    """Refuses `image_data_format() == "channels_first"` where it cannot run."""
    if keras.config.image_data_format() == "channels_first" and not channels_first_supported():
        raise ValueError(
            "channels_first ShuffleNets cannot run here: TensorFlow's CPU convolution "
            "kernels take NHWC (channels_last) only unless TensorFlow runs with oneDNN (on "
            "by default on x86 CPUs with AVX-512), and this machine has neither that nor a "
            "GPU. Build the model with keras.config.set_image_data_format('channels_last'), "
            "or run on a GPU, or use the JAX backend (KERAS_BACKEND=jax). "
            "Received: image_data_format='channels_first'"
        )


def learned_shuffles_in_file(path):
    """How many RelaxedShuffle entries a Keras weights file holds (`.weights.h5`, `.keras`).

    Keras names a layer's entry by its class (`layers/relaxed_shuffle_3`), with or
    without variables (relaxed or hardened). A file that is neither HDF5 nor a `.keras`
    archive raises ValueError naming it.
    """
    try:
        return _keras_internals.count_layer_entries(path, "relaxed_shuffle")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(
            "`weights` must be a Keras weights file (HDF5 `.weights.h5`, or a `.keras` "
            f"archive); {path} cannot be read as one ({type(error).__name__}: {error}). "
            f"Received: weights={path!r}"
        ) from None


PADDING_ATTRIBUTE = "keras_autoshuffle_padding"


def mark_padding(path, padding):
    """Records in a `.weights.h5` file the padding of the net it fits (see `_file_padding`)."""
    import h5py

    with h5py.File(path, "a") as handle:
        handle.attrs[PADDING_ATTRIBUTE] = padding


def _file_padding(path):
    """The padding a weights file was marked with (`mark_padding`), or None."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            value = handle.attrs.get(PADDING_ATTRIBUTE)
    except OSError:  # not HDF5 (e.g. a .keras archive): unmarked
        return None
    return value.decode() if isinstance(value, bytes) else value


def check_common_args(
    *,
    weights,
    shuffle,
    penalty,
    stem,
    include_top,
    pooling,
    classes,
    classifier_activation,
    shuffle_initializer,
    padding,
    sinkhorn_iterations,
    shuffle_forward="relaxed",
    shuffle_permutations=None,
):
    """Validates the arguments shared by both families, in a fixed order.

    Returns:
        The `Options` the builder makes its units with.
    """
    if isinstance(weights, str) and weights == "imagenet":
        # torchvision's network: the width, stem and classes are checked by `finish`
        # (`pretrained.imagenet_weights_file`), once the model is built.
        if padding != "torch":
            raise ValueError(
                "weights='imagenet' are torchvision's network, which pads as PyTorch: build "
                f"it with padding='torch' (the default). Received: padding={padding!r}"
            )
        if stem == "cifar":
            raise ValueError(
                "weights='imagenet' are torchvision's network, which has the ImageNet stem: "
                f"build it with stem='imagenet' or 'auto'. Received: stem={stem!r}"
            )
        # Learned shuffles always start at the manual shuffle: the pretrained net.
        _validation.choice(shuffle_initializer, SHUFFLE_INITIALIZERS, "shuffle_initializer")
        shuffle_initializer = "manual"
        weights = None  # no file to check here; `finish` fetches it
    elif weights is not None and not (
        isinstance(weights, (str, os.PathLike)) and os.path.isfile(weights)
    ):
        raise ValueError(
            "`weights` must be None (random initialization), 'imagenet' (torchvision's "
            "ImageNet weights, ShuffleNet v2 only) or the path to an existing weights file. "
            f"Received: weights={weights!r}"
        )
    _validation.choice(shuffle, SHUFFLES, "shuffle")
    if weights is not None and learned_shuffles_in_file(weights) and shuffle == "manual":
        raise ValueError(
            f"The weights file {weights} was saved from a model with learned shuffles "
            "(RelaxedShuffle layers: an AutoShuffleNet), but this model's shuffles are manual; "
            "loading would silently drop the learned matrices. Build the model with "
            "shuffle='auto' (AutoShuffleNetV1/V2) to load them (a hardened net's file "
            f"hardens the new net's shuffles at its permutations). Received: weights={weights!r}"
        )
    penalty = _validation.penalty(penalty)
    _validation.choice(shuffle_initializer, SHUFFLE_INITIALIZERS, "shuffle_initializer")
    _validation.choice(padding, PADDINGS, "padding")
    sinkhorn_iterations = check_iterations(sinkhorn_iterations, "sinkhorn_iterations")
    marked = None if weights is None else _file_padding(weights)
    if marked is not None and marked != padding:
        raise ValueError(
            f"The weights file {weights} fits nets built with padding={marked!r} (e.g. "
            "weights converted from torchvision); with another padding the net would compute "
            f"another function. Build it with padding={marked!r}. Received: padding={padding!r}"
        )
    _validation.choice(stem, STEMS, "stem")
    if not isinstance(include_top, bool):
        raise ValueError(
            f"`include_top` must be True or False. Received: include_top={include_top!r}"
        )
    _validation.choice(pooling, POOLINGS, "pooling")
    if include_top:
        _validation.positive_int(classes, "classes")
        try:
            keras.activations.get(classifier_activation)
        except (ValueError, TypeError) as error:
            raise ValueError(
                "`classifier_activation` must be None or a Keras activation. "
                f"Received: classifier_activation={classifier_activation!r}"
            ) from error
    _validation.choice(shuffle_forward, SHUFFLE_FORWARDS, "shuffle_forward")
    shuffle_permutations = _check_permutations(shuffle_permutations, shuffle)
    check_image_data_format()
    return Options(
        shuffle,
        penalty,
        shuffle_initializer,
        padding,
        sinkhorn_iterations,
        shuffle_forward,
        shuffle_permutations,
    )


def common_arguments(arguments):
    """The entries of a builder's call (its `locals()`) that `check_common_args` takes."""
    return {name: arguments[name] for name in inspect.signature(check_common_args).parameters}


def _check_permutations(value, shuffle):
    """`shuffle_permutations` as {name: permutation}: a dict, and only with learned shuffles
    (each permutation is checked by the layer it fixes)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            "`shuffle_permutations` must be a dict {shuffle layer name: permutation}. "
            f"Received: shuffle_permutations of type {type(value).__name__}"
        )
    if shuffle != "auto":
        raise ValueError(
            "`shuffle_permutations` fixes learned shuffles; it needs shuffle='auto'. "
            f"Received: shuffle={shuffle!r}"
        )
    return dict(value)


def check_config(values, length, name, multiple=1):
    """A builder's `channels` / `repeats` override: `length` positive integers, each a
    multiple of `multiple`; returned as a tuple."""
    try:
        values = tuple(values)
    except TypeError:
        values = None
    if (
        values is None
        or len(values) != length
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
        or any(v % multiple for v in values)
    ):
        rule = f", each a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(
            f"`{name}` must be {length} positive integers{rule}. Received: {name}={values!r}"
        )
    return values


def resolve_input(input_tensor, input_shape, include_top, stem):
    """Makes the model input and picks the stem (a small `obtain_input_shape`).

    With neither `input_tensor` nor `input_shape`, the input is 224x224x3 when
    `include_top` (as keras.applications) and (None, None, 3) otherwise. Any channel
    count is accepted. "auto" picks the CIFAR stem when both spatial sides are known
    and at most 64.

    Returns:
        `(model_inputs, x, stem)`: the tensors the model starts from (the source inputs
        of `input_tensor` when given), the image tensor, and "imagenet" or "cifar".
    """
    first = keras.config.image_data_format() == "channels_first"
    if input_tensor is not None and not keras.backend.is_keras_tensor(input_tensor):
        raise ValueError(
            "`input_tensor` must be a Keras tensor (from `keras.Input()` or a layer). "
            f"Received: input_tensor={type(input_tensor).__name__}"
        )
    if input_tensor is not None and input_shape is None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is None:
        side = 224 if include_top else None
        input_shape = (3, side, side) if first else (side, side, 3)
    try:
        input_shape = tuple(None if d is None else int(d) for d in input_shape)
    except (TypeError, ValueError) as error:
        raise ValueError(
            "`input_shape` must be a tuple of three integers. "
            f"Received: input_shape={input_shape!r}"
        ) from error
    if len(input_shape) != 3 or any(d is not None and d < 1 for d in input_shape):
        raise ValueError(
            "`input_shape` must be a tuple of three positive integers (height, width, channels "
            f"for channels_last). Received: input_shape={input_shape}"
        )
    sides = input_shape[1:] if first else input_shape[:2]
    channels = input_shape[0] if first else input_shape[-1]
    if channels is None:
        raise ValueError(f"The channel count must be known. Received: input_shape={input_shape}")
    if stem == "auto":
        small = all(s is not None and s <= CIFAR_MAX_SIDE for s in sides)
        stem = "cifar" if small else "imagenet"
    if any(s is not None and s < MIN_SIZE[stem] for s in sides):
        raise ValueError(
            f"Input sides must be at least {MIN_SIZE[stem]} with the {stem} stem. "
            f"Received: input_shape={input_shape}"
        )
    if input_tensor is None:
        inputs = layers.Input(shape=input_shape)
        return inputs, inputs, stem
    if tuple(input_tensor.shape[1:]) != input_shape:
        raise ValueError(
            f"`input_shape` {input_shape} does not match `input_tensor`'s shape "
            f"{tuple(input_tensor.shape[1:])}. Received: input_shape={input_shape}"
        )
    sources = keras.utils.get_source_inputs(input_tensor)
    return (sources[0] if len(sources) == 1 else sources), input_tensor, stem


def manual_twin(builder, arguments, options, image_shape):
    """For a learned-shuffle net, a function building the same net with manual shuffles
    (from `arguments`, the private builder's call) on `image_shape`; None otherwise."""
    if options.shuffle != "auto":
        return None
    twin = {
        **arguments,
        "input_tensor": None,
        "input_shape": image_shape,
        "name": None,
        "shuffle": "manual",
        "shuffle_initializer": "random",
        "shuffle_forward": "relaxed",
        "shuffle_permutations": None,
    }
    return functools.partial(builder, **twin)


def finish(
    inputs, x, include_top, pooling, classes, classifier_activation, weights, name, manual_twin
):
    """Adds the classifier (or the optional pooling), makes the Model, loads `weights`.

    `weights="imagenet"` is torchvision's checkpoint for the model's width, converted and
    cached once (`pretrained.imagenet_weights_file`), then loaded as a file.
    `manual_twin`: for a learned-shuffle model, a function that builds the same net with
    manual shuffles from `weights`. A weights file without learned shuffles (a manual
    net's, e.g. converted from torchvision) is loaded through it and copied layer by
    layer by name; Keras's `load_weights` cannot take it, the file has no matrices.
    """
    if include_top:
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        # N(0, 0.01) as megvii's ShuffleNet v1 / v2: the initial logits are near 0. With
        # Keras's Glorot default the v1 loss started at 4.7 (not ln 10) and training at
        # lr 0.1 diverged in the first epoch on the digits.
        x = layers.Dense(
            classes,
            activation=classifier_activation,
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
            name="predictions",
        )(x)
    elif pooling == "avg":
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = layers.GlobalMaxPooling2D(name="max_pool")(x)
    model = keras.Model(inputs, x, name=name)
    if isinstance(weights, str) and weights == "imagenet":
        from keras_autoshuffle.applications import pretrained

        weights = pretrained.imagenet_weights_file(model, include_top, classes)
    if weights is not None and manual_twin is not None and not learned_shuffles_in_file(weights):
        for layer in manual_twin().layers:
            if layer.weights:
                model.get_layer(layer.name).set_weights(layer.get_weights())
    elif weights is not None:
        model.load_weights(weights)
    return model


def width_name(width):
    """`1.5` -> `"x1_5"`, torchvision's variant suffix."""
    return "x" + f"{float(width):g}".replace(".", "_") + ("_0" if float(width).is_integer() else "")


def preprocess_input(x, data_format=None):
    """Scales pixels from [0, 255] to [0, 1], then normalises each RGB channel with
    ImageNet's mean and standard deviation (torchvision's "torch" mode).

    Args:
        x: a float array or tensor of RGB images, values in [0, 255], rank 3 or 4.
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        The preprocessed images, same shape (a NumPy array for NumPy input).
    """
    data_format = _validation.data_format(data_format)
    is_numpy = isinstance(x, np.ndarray)
    x = ops.convert_to_tensor(x)
    if not keras.backend.is_float_dtype(x.dtype):
        x = ops.cast(x, keras.config.floatx())
    axis = -1 if data_format == "channels_last" else (0 if len(x.shape) == 3 else 1)
    if len(x.shape) not in (3, 4) or x.shape[axis] != 3:
        raise ValueError(
            f"`x` must be RGB images of rank 3 or 4 with 3 channels ({data_format}). "
            f"Received: x.shape={tuple(x.shape)}"
        )
    shape = [1] * len(x.shape)
    shape[axis] = 3
    mean = ops.reshape(ops.convert_to_tensor(IMAGENET_MEAN, dtype=x.dtype), shape)
    std = ops.reshape(ops.convert_to_tensor(IMAGENET_STD, dtype=x.dtype), shape)
    x = (x / 255.0 - mean) / std
    return ops.convert_to_numpy(x) if is_numpy else x


def _layer_macs(layer):
    """Multiply-adds of one layer for the shapes it was last built on."""
    if isinstance(layer, RelaxedShuffle):
        if layer.is_hardened:
            return 0
        # N^2 per pixel = (pixels * N) * N.
        return int(np.prod(layer.output.shape[1:])) * layer.matrix.shape[0]
    if isinstance(layer, layers.DepthwiseConv2D):
        return int(np.prod(layer.output.shape[1:]) * np.prod(layer.kernel_size))
    if isinstance(layer, layers.Conv2D):
        out = layer.output.shape
        first = layer.data_format == "channels_first"
        in_channels = layer.input.shape[1 if first else -1]
        per_output = np.prod(layer.kernel_size) * in_channels // layer.groups
        return int(np.prod(out[1:]) * per_output)
    if isinstance(layer, layers.Dense):
        return int(np.prod(layer.input.shape[1:]) * layer.units)
    if hasattr(layer, "layers"):
        return sum(_layer_macs(inner) for inner in layer.layers)
    return 0


def count_macs(model, input_shape=None):
    """Counts a model's multiply-adds per image.

    Counted: Conv2D (grouped included), DepthwiseConv2D, Dense, and relaxed shuffles
    (N^2 per pixel). Not counted (as torchvision and megvii): BatchNormalization,
    activations, pooling, additions, concatenation; ChannelShuffle and hardened
    shuffles (a data movement) cost 0.

    Args:
        model: a functional Keras model.
        input_shape: the image shape without the batch axis, e.g. (224, 224, 3);
            default: the model's own input shape, which must then be fully known.
            With another shape the model is cloned on a new input (same layers'
            configs, new weights), which takes a few seconds for a large net.

    Returns:
        The number of multiply-adds for one image (an int).
    """
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if tuple(model.input.shape[1:]) != input_shape:
            model = keras.models.clone_model(model, input_tensors=keras.Input(shape=input_shape))
    shape = tuple(model.input.shape[1:])
    if any(d is None for d in shape):
        raise ValueError(
            "The model's input shape is not fully known; pass `input_shape`. "
            f"Received: input_shape={input_shape}"
        )
    return int(sum(_layer_macs(layer) for layer in model.layers))
