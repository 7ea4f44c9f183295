"""The checks of the public builders' arguments, in a fixed order, each error ending in
`Received: arg=value` (`check_shared_arguments` for the arguments both families take,
`check_config` for the test-size overrides, `resolve_input` for the input), and whether
the backend can run channels_first here."""

import functools
import os
import types
from collections.abc import Callable
from typing import TypeVar

import keras
from keras import layers, ops

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import common
from keras_autoshuffle.applications.weights import pretrained, registry
from keras_autoshuffle.constraints import check_iterations
from keras_autoshuffle.hard_forward import FORWARDS
from keras_autoshuffle.layers import SHUFFLE_INITIALIZERS

SHUFFLES = ("manual", "auto")
STEMS = ("imagenet", "cifar", "auto")
POOLINGS = (None, "avg", "max")
# "auto" picks the CIFAR stem when both spatial sides are at most this.
CIFAR_MAX_SIDE = 64
# Total stride of the network for each stem: the smallest accepted input side.
MIN_SIZE = {"imagenet": 32, "cifar": 8}
# The arguments all four builders take, in their signatures' order after the family's
# own (`width`; v1: `groups`).
COMMON_ARGUMENTS = (
    "include_top",
    "weights",
    "input_tensor",
    "input_shape",
    "pooling",
    "classes",
    "classifier_activation",
    "name",
    "shuffle",
    "penalty",
    "stem",
    "shuffle_initializer",
    "padding",
    "sinkhorn_iterations",
    "shuffle_forward",
    "shuffle_permutations",
    "features_only",
)
# The arguments only learned shuffles use: `AutoShuffleNetV1/V2` take them; the manual
# builders (`ShuffleNetV1/V2`) build with these values.
MANUAL_SHUFFLE_ARGUMENTS = {
    "shuffle": "manual",
    "penalty": 1e-3,
    "shuffle_initializer": "random",
    "sinkhorn_iterations": 10,
    "shuffle_forward": "relaxed",
    "shuffle_permutations": None,
}

_Builder = TypeVar("_Builder", bound=Callable)


def manual_only(builder: _Builder) -> _Builder:
    """Wraps a manual builder (`ShuffleNetV1/V2`) so that a learned-shuffle argument passed to
    it is a `TypeError` that names it and the builder that takes it (`AutoShuffleNetV1/V2`),
    instead of Python's bare "unexpected keyword argument"."""

    @functools.wraps(builder)
    def wrapper(*args, **kwargs):
        for name, value in kwargs.items():
            if name in MANUAL_SHUFFLE_ARGUMENTS:
                raise TypeError(
                    f"`{builder.__name__}` builds the manual channel shuffle and takes no "
                    f"`{name}`; the learned-shuffle arguments are `Auto{builder.__name__}`'s "
                    f'(`Auto{builder.__name__}(..., shuffle="auto")`). Received: {name}={value!r}'
                )
        return builder(*args, **kwargs)

    return wrapper


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


def check_shared_arguments(shared):
    """Validates the arguments both families take, in a fixed order: `shared`, a private
    builder's `**shared`, must hold exactly the names of `COMMON_ARGUMENTS` (TypeError
    otherwise).

    Returns:
        The `Options` the builder makes its units with.
    """
    unknown = sorted(set(shared) - set(COMMON_ARGUMENTS))
    missing = sorted(set(COMMON_ARGUMENTS) - set(shared))
    if unknown or missing:
        raise TypeError(
            "A ShuffleNet builder takes the arguments of `COMMON_ARGUMENTS`, all by "
            f"keyword. Received: unknown {unknown}, missing {missing}"
        )
    args = types.SimpleNamespace(**shared)
    weights, shuffle, padding = args.weights, args.shuffle, args.padding
    weights, shuffle_initializer = _check_weights(
        weights, padding, args.stem, args.shuffle_initializer
    )
    _validation.choice(shuffle, SHUFFLES, "shuffle")
    learned = weights is not None and pretrained.learned_shuffles_in_file(weights)
    if learned and shuffle == "manual":
        raise ValueError(
            f"The weights file {weights} was saved from a model with learned shuffles "
            "(RelaxedShuffle layers: an AutoShuffleNet), but this model's shuffles are manual; "
            "loading would silently drop the learned matrices. Build the model with "
            "shuffle='auto' (AutoShuffleNetV1/V2) to load them (a hardened net's file "
            f"hardens the new net's shuffles at its permutations). Received: weights={weights!r}"
        )
    penalty = _validation.penalty(args.penalty)
    _validation.choice(shuffle_initializer, SHUFFLE_INITIALIZERS, "shuffle_initializer")
    _validation.choice(padding, common.PADDINGS, "padding")
    sinkhorn_iterations = check_iterations(args.sinkhorn_iterations, "sinkhorn_iterations")
    marked = None if weights is None else pretrained.file_padding(weights)
    if marked is not None and marked != padding:
        raise ValueError(
            f"The weights file {weights} fits nets built with padding={marked!r} (e.g. "
            "weights converted from torchvision); with another padding the net would compute "
            f"another function. Build it with padding={marked!r}. Received: padding={padding!r}"
        )
    _validation.choice(args.stem, STEMS, "stem")
    _check_top(args.include_top, args.pooling, args.classes, args.classifier_activation)
    _check_features_only(args.features_only, args.include_top, args.pooling, args.classes)
    _validation.choice(args.shuffle_forward, FORWARDS, "shuffle_forward")
    shuffle_permutations = _check_permutations(args.shuffle_permutations, shuffle)
    check_image_data_format()
    return common.Options(
        shuffle,
        penalty,
        shuffle_initializer,
        padding,
        sinkhorn_iterations,
        args.shuffle_forward,
        shuffle_permutations,
    )


def _check_weights(weights, padding, stem, shuffle_initializer):
    """`(weights file or None, shuffle_initializer)`: "imagenet" or a registry name
    (`registry.names()`) needs torchvision's padding and stem and starts learned
    shuffles at the manual one; a path must exist."""
    if registry.is_pretrained(weights):
        # torchvision's network: the width, stem and classes are checked by `finish`
        # (`pretrained.imagenet_weights_file`), once the model is built.
        if padding != "torch":
            raise ValueError(
                f"weights={weights!r} are torchvision's network, which pads as PyTorch: build "
                f"it with padding='torch' (the default). Received: padding={padding!r}"
            )
        if stem == "cifar":
            raise ValueError(
                f"weights={weights!r} are torchvision's network, which has the ImageNet stem: "
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
            "ImageNet weights, ShuffleNet v2 only), the name of published weights (one of "
            f"{registry.names()}) or the path to an existing weights file. "
            f"Received: weights={weights!r}"
        )
    return weights, shuffle_initializer


def _check_top(include_top, pooling, classes, classifier_activation):
    """Checks the classifier arguments (`classes`, the activation) with `include_top`."""
    _validation.boolean(include_top, "include_top")
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


def _check_features_only(features_only, include_top, pooling, classes):
    """`features_only=True` builds the feature pyramid: no classifier, no pooling."""
    _validation.boolean(features_only, "features_only")
    if not features_only:
        return
    if include_top:
        raise ValueError(
            "`features_only=True` returns the feature maps P2-P5, without the classifier: "
            "pass include_top=False. Received: include_top=True"
        )
    if pooling is not None:
        raise ValueError(
            "`features_only=True` returns the 4D feature maps P2-P5; it takes no pooling. "
            f"Received: pooling={pooling!r}"
        )
    if classes != 1000:
        raise ValueError(
            "`features_only=True` builds no classifier, so `classes` has no use: leave it "
            f"out. Received: classes={classes!r}"
        )


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
        or not all(_validation.is_integer(v) and v > 0 for v in values)
        or any(v % multiple for v in values)
    ):
        rule = f", each a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(
            f"`{name}` must be {length} positive integers{rule}. Received: {name}={values!r}"
        )
    return tuple(int(v) for v in values)


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
