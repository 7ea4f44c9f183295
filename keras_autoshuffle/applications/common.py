"""What the ShuffleNet v1 / v2 builders build with: the layer factories (`conv`, `dwconv`,
`pool`, `stem`, `Options.shuffle_layer`), the classifier head and the loading of weights
(`finish`) and the multiply-add counter. The argument checks are in `arguments`, the
layer names in `architecture`, the weights files in `weights`, the custom layers in
`keras_autoshuffle.layers`."""

import dataclasses
import functools

import keras
import numpy as np
from keras import layers

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.weights import pretrained, registry
from keras_autoshuffle.layers import ChannelShuffle, GroupedConv2D, RelaxedShuffle


def batch_norm(name, gamma_initializer="ones"):
    """BatchNormalization as PyTorch trains ShuffleNets (momentum 0.1 there, 0.9 here).

    Keras's default momentum of 0.99 leaves the moving statistics far behind the
    weights during short trainings: evaluation accuracy stays at chance.
    """
    return layers.BatchNormalization(
        axis=_validation.channel_axis(),
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
    return layers.ZeroPadding2D(1, name=arch.pad_name(name))(x), "valid"


def stem(filters, kind, options):
    """The stem: a 3x3 conv-BN-ReLU, stride 2 and followed by a 3x3 stride-2 max-pool
    with the "imagenet" stem, stride 1 and no pool with the "cifar" one."""

    def apply(x):
        imagenet = kind == "imagenet"
        x = options.conv(filters, 3, arch.STEM_CONV, strides=2 if imagenet else 1)(x)
        x = batch_norm(arch.STEM_BN)(x)
        x = layers.ReLU(name=arch.STEM_RELU)(x)
        return options.pool("max", arch.STEM_POOL)(x) if imagenet else x

    return apply


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
            return RelaxedShuffle(
                penalty=self.penalty,
                sinkhorn_iterations=self.sinkhorn_iterations,
                data_format=data_format,
                shuffle_initializer=self.shuffle_initializer,
                groups=groups if self.shuffle_initializer == "manual" else None,
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
        """A bias-free convolution (1x1, or 3x3 padded as `_pad`)."""

        def apply(x):
            x, mode = _pad(x, strides, name, self.padding)
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

    def dwconv(self, strides, name):
        """A bias-free 3x3 depthwise convolution padded as `_pad`."""

        def apply(x):
            x, mode = _pad(x, strides, name, self.padding)
            dwconv = layers.DepthwiseConv2D(
                3, strides=strides, padding=mode, use_bias=False, name=name
            )
            return dwconv(x)

        return apply

    def pool(self, kind, name):
        """A 3x3 stride-2 max or average pool padded as `_pad`.

        With "torch" the zeros stand in for PyTorch's padding: for the max-pool (after a
        ReLU, inputs >= 0) they never win over a real pixel, and the average-pool divides
        by 9 at the border too, as PyTorch's AvgPool2d (count_include_pad=True, megvii's
        v1 shortcut). TF's 'same' average-pool divides by the pixels inside the image.
        """
        pooling = {"max": layers.MaxPooling2D, "avg": layers.AveragePooling2D}[kind]

        def apply(x):
            x, mode = _pad(x, 2, name, self.padding)
            return pooling(3, strides=2, padding=mode, name=name)(x)

        return apply


def manual_twin(rebuild, shared, image_shape):
    """A function building the same net with manual shuffles on `image_shape` (`rebuild`
    is the private builder with the family's arguments bound, `shared` the other
    arguments); its keyword arguments override those (e.g. `weights`)."""
    twin = {
        **shared,
        "input_tensor": None,
        "input_shape": image_shape,
        "name": None,
        "shuffle": "manual",
        "shuffle_initializer": "random",
        "shuffle_forward": "relaxed",
        "shuffle_permutations": None,
        "features_only": False,
    }
    return functools.partial(rebuild, **twin)


def _top(x, shared):
    """The classifier (`include_top`), or the optional pooling."""
    if shared["include_top"]:
        x = layers.GlobalAveragePooling2D(name=arch.AVG_POOL)(x)
        # N(0, 0.01) as megvii's ShuffleNet v1 / v2: the initial logits are near 0. With
        # Keras's Glorot default the v1 loss started at 4.7 (not ln 10) and training at
        # lr 0.1 diverged in the first epoch on the digits.
        return layers.Dense(
            int(shared["classes"]),  # checked: an integer, maybe NumPy's
            activation=shared["classifier_activation"],
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
            name=arch.PREDICTIONS,
        )(x)
    if shared["pooling"] == "avg":
        return layers.GlobalAveragePooling2D(name=arch.AVG_POOL)(x)
    if shared["pooling"] == "max":
        return layers.GlobalMaxPooling2D(name=arch.MAX_POOL)(x)
    return x


# The feature pyramid's levels (keras-hub's names: Pk has stride 2**k): P2 after the
# ImageNet stem's max-pool, P3-P5 at the ends of stages 2-4.
PYRAMID_LEVELS = ("P2", "P3", "P4", "P5")


def pyramid_outputs(model: keras.Model) -> dict:
    """`{"P2": ..., "P5": ...}`: the outputs of the layers that end the stem and stages 2-4
    of a ShuffleNet built here (the one place that says which layers end them).

    Raises:
        ValueError: a model without the ImageNet stem (the CIFAR stem has no max-pool:
            its strides are not 4-32), naming the stem.
    """
    if arch.STEM_POOL not in {layer.name for layer in model.layers}:
        raise ValueError(
            "The feature pyramid (P2-P5, strides 4-32) needs the ImageNet stem; this net has "
            "the CIFAR stem (stride 1, no max-pool), picked by stem='cifar' or by stem='auto' "
            "with input sides of 64 or less. Build it with stem='imagenet'. "
            "Received: stem='cifar'"
        )
    ends = [arch.STEM_POOL, *arch.describe(model).stage_ends()]
    return {
        level: model.get_layer(name).output
        for level, name in zip(PYRAMID_LEVELS, ends, strict=True)
    }


def finish(inputs, x, name, rebuild, shared, options, image_shape):
    """Adds the classifier (or the optional pooling), makes the Model, loads `weights`.

    `shared` holds the arguments both families take (`include_top`, `pooling`, `classes`,
    `classifier_activation` and `weights` are read from it), `options` their checked form;
    `rebuild` and `image_shape` make the manual twin (`manual_twin`).

    `weights="imagenet"` (or the registry name of the model's width, e.g.
    "shufflenet_v2_x1_0.imagenet") is torchvision's checkpoint for the model's width,
    converted into the manual twin and cached once (`pretrained.imagenet_weights_file`), then
    loaded as a file. A weights file without learned shuffles (a manual net's, e.g.
    converted from torchvision) given to a learned-shuffle model is loaded into its
    manual twin and copied layer by layer by name; Keras's `load_weights` cannot take
    it, the file has no matrices. Last, `shuffle_permutations` entries that name no
    shuffle are refused. With `features_only` the model returned is the pyramid's
    (`pyramid_outputs`: a dict P2-P5) on the same layers.
    """
    model = keras.Model(inputs, _top(x, shared), name=name)
    weights = shared["weights"]
    twin = manual_twin(rebuild, shared, image_shape)
    if registry.is_pretrained(weights):
        build = functools.partial(twin, weights=None)
        weights = pretrained.imagenet_weights_file(
            model, shared["include_top"], shared["classes"], build, weights
        )
    learned = options.shuffle == "auto"
    if weights is not None and learned and not pretrained.learned_shuffles_in_file(weights):
        for layer in twin(weights=weights).layers:
            if layer.weights:
                model.get_layer(layer.name).set_weights(layer.get_weights())
    elif weights is not None:
        model.load_weights(weights)
    options.check_permutations_used(model)
    if shared["features_only"]:
        return keras.Model(model.inputs, pyramid_outputs(model), name=name)
    return model


def model_prefix(version, shuffle):
    """`shufflenet_v1` for manual shuffles, `autoshufflenet_v1` for learned ones."""
    return f"{'auto' if shuffle == 'auto' else ''}shufflenet_{version}"


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


def count_macs(model: keras.Model, input_shape: tuple[int | None, ...] | None = None) -> int:
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
