"""ShuffleNet v2 and AutoShuffleNet v2 (torchvision / megvii architecture).

Layer names, in order (S = stage 2..4, K = unit 1..repeats):

    stem:  stem_conv, stem_bn, stem_relu (cifar stem) or stem_conv_pad, stem_conv,
           stem_bn, stem_relu, stem_pool_pad, stem_pool (imagenet stem)
    down-sampling unit (K = 1, stride 2), two branches on the same input:
        left:  stageS_unit1_left_dwconv_pad, _left_dwconv, _left_dwbn, _left_conv,
               _left_bn, _left_relu
        right: stageS_unit1_conv1, _bn1, _relu1, _dwconv_pad, _dwconv, _dwbn, _conv2,
               _bn2, _relu2
        stageS_unit1_concat ([left, right]), stageS_unit1_shuffle
    basic unit (K > 1):
        stageS_unitK_split (channel halves [identity, branch]),
        branch: stageS_unitK_conv1, _bn1, _relu1, _dwconv, _dwbn, _conv2, _bn2, _relu2
        stageS_unitK_concat ([identity, branch]), stageS_unitK_shuffle
    head:  head_conv, head_bn, head_relu, then avg_pool, predictions (include_top)
           or avg_pool / max_pool (pooling)

`_shuffle` is ChannelShuffle(groups=2) ("manual") or RelaxedShuffle ("auto"), after the
concat as in the paper's Fig. unit2.

Padding: exactly torchvision's (padding=1 on every 3x3 layer), so torchvision's weights
give torchvision's logits (`load_torchvision_weights`), or Keras's 'same' with
`padding="same"`: see `common._pad`.
"""

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import keras
from keras import layers

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import architecture, arguments, common
from keras_autoshuffle.layers import ChannelSplit

# The channels per width are `architecture.V2_CONFIGS`, the units per stage `.REPEATS`.


def _down_unit(filters, options, prefix):
    """The stride-2 unit: both branches see the whole input; `filters` output channels."""
    half = filters // 2
    bn = common.batch_norm
    axis = _validation.channel_axis()
    name = functools.partial(architecture.part_layer, prefix)

    def apply(x):
        left = options.dwconv(2, name("left_dwconv"))(x)
        left = bn(name("left_dwbn"))(left)
        left = options.conv(half, 1, name("left_conv"))(left)
        left = bn(name("left_bn"))(left)
        left = layers.ReLU(name=name("left_relu"))(left)
        right = _branch(half, 2, options, prefix)(x)
        x = layers.Concatenate(axis=axis, name=name("concat"))([left, right])
        return options.shuffle_layer(2, name("shuffle"))(x)

    return apply


def _basic_unit(filters, options, prefix):
    """The stride-1 unit: half the channels pass, the other half go through the branch."""
    axis = _validation.channel_axis()
    name = functools.partial(architecture.part_layer, prefix)

    def apply(x):
        identity, x = ChannelSplit(name=name("split"))(x)
        x = _branch(filters // 2, 1, options, prefix)(x)
        x = layers.Concatenate(axis=axis, name=name("concat"))([identity, x])
        return options.shuffle_layer(2, name("shuffle"))(x)

    return apply


def _branch(filters, strides, options, prefix):
    """pw conv-BN-ReLU, 3x3 dw conv-BN, pw conv-BN-ReLU."""
    bn = common.batch_norm
    name = functools.partial(architecture.part_layer, prefix)

    def apply(x):
        x = options.conv(filters, 1, name("conv1"))(x)
        x = bn(name("bn1"))(x)
        x = layers.ReLU(name=name("relu1"))(x)
        x = options.dwconv(strides, name("dwconv"))(x)
        x = bn(name("dwbn"))(x)
        x = options.conv(filters, 1, name("conv2"))(x)
        x = bn(name("bn2"))(x)
        return layers.ReLU(name=name("relu2"))(x)

    return apply


def _shufflenet_v2(*, width, channels=None, repeats=None, prefix=None, **shared):
    """The builder behind `ShuffleNetV2` / `AutoShuffleNetV2`; `shared` holds the
    arguments both families take (`arguments.COMMON_ARGUMENTS`), all of them, by keyword.

    `prefix` starts the default model name (default: `shufflenet_v2`, or
    `autoshufflenet_v2` with learned shuffles). `channels` (stem, stage2, stage3, stage4,
    head) and `repeats` (units per stage 2-4) replace the width's configuration: small
    nets with the same structure, for tests (`channels=(8, 16, 32, 64, 64),
    repeats=(1, 1, 1)`).
    """
    # The same call for other shared arguments: `finish` builds the manual twin with it.
    rebuild = functools.partial(
        _shufflenet_v2, width=width, channels=channels, repeats=repeats, prefix=prefix
    )
    options = arguments.check_shared_arguments(shared)
    if channels is None:
        width = _validation.choice(width, architecture.V2_WIDTHS, "width")
        channels = architecture.V2_CONFIGS[width]
    channels = arguments.check_config(channels, 5, "channels", multiple=2)
    repeats = architecture.REPEATS if repeats is None else repeats
    repeats = arguments.check_config(repeats, 3, "repeats")
    inputs, x, stem = arguments.resolve_input(
        shared["input_tensor"], shared["input_shape"], shared["include_top"], shared["stem"]
    )
    image_shape = tuple(x.shape[1:])

    x = common.stem(channels[0], stem, options)(x)
    for stage, (filters, units) in enumerate(zip(channels[1:4], repeats, strict=True), 2):
        for unit in range(1, units + 1):
            block = _down_unit if unit == 1 else _basic_unit
            x = block(filters, options, architecture.unit_prefix(stage, unit))(x)
    x = options.conv(channels[4], 1, architecture.HEAD_CONV)(x)
    x = common.batch_norm(architecture.HEAD_BN)(x)
    x = layers.ReLU(name=architecture.HEAD_RELU)(x)

    prefix = prefix or common.model_prefix("v2", shared["shuffle"])
    name = shared["name"] or f"{prefix}_{architecture.width_name(width)}"
    return common.finish(inputs, x, name, rebuild, shared, options, image_shape)


@arguments.manual_only
def ShuffleNetV2(
    width: float = 1.0,
    include_top: bool = True,
    weights: str | os.PathLike | None = None,
    input_tensor: Any = None,
    input_shape: tuple[int | None, ...] | None = None,
    pooling: Literal["avg", "max"] | None = None,
    classes: int = 1000,
    classifier_activation: str | Callable | None = "softmax",
    name: str | None = None,
    stem: Literal["auto", "imagenet", "cifar"] = "auto",
    padding: Literal["torch", "same"] = "torch",
    features_only: bool = False,
) -> keras.Model:
    """Instantiates the ShuffleNet v2 architecture.

    The torchvision / megvii network, its channel shuffles fixed (ChannelShuffle); learned
    shuffles: `AutoShuffleNetV2`, which takes the same arguments and the learned shuffles'
    own.

    Stage repeats 4, 8, 4; channels per width (stem, stages 2-4, head):
    0.5: 24, 48, 96, 192, 1024; 1.0: 24, 116, 232, 464, 1024;
    1.5: 24, 176, 352, 704, 1024; 2.0: 24, 244, 488, 976, 2048.
    BatchNormalization uses momentum 0.9, epsilon 1e-5 (PyTorch's defaults).

    Args:
        width: width multiplier, one of 0.5, 1.0, 1.5, 2.0 (default 1.0).
        include_top: whether to include the global pooling and the classifier.
        weights: None (random initialization), "imagenet", the name of published weights
            (`applications.CHECKPOINTS[width].name`, e.g. "shufflenet_v2_x1_0.imagenet", or
            its preset spelling; it must be of `width`) or the path to a Keras weights file
            (`.weights.h5`). "imagenet" (or the name): torchvision's ImageNet-1K checkpoint
            for `width` (`applications.CHECKPOINTS[width]`: URL, SHA-256, accuracy;
            `applications.imagenet_preprocessing(width)` is its evaluation transform),
            downloaded once into Keras's cache (docs/guide/pretrained.md: mirrors, hash
            check), read without torch and cached as a `.weights.h5`. It needs
            `stem="imagenet"` (or "auto" with input sides above 64), `padding="torch"`,
            and `classes=1000` with `include_top`.
        input_tensor: optional Keras tensor (output of `keras.Input()`) as input.
        input_shape: optional shape tuple, e.g. (224, 224, 3); any channel count.
            Default: (224, 224, 3) with `include_top`, (None, None, 3) without.
        pooling: with `include_top=False`: None (4D feature map), "avg" or "max".
        classes: number of classes (with `include_top`).
        classifier_activation: activation of the "predictions" layer; None gives logits.
        name: model name (default `shufflenet_v2_<width>`, e.g. `shufflenet_v2_x1_0`).
        stem: "imagenet" (3x3 stride-2 conv + 3x3 stride-2 max-pool), "cifar" (3x3
            stride-1 conv, no max-pool) or "auto" ("cifar" when both spatial sides are
            at most 64).
        padding: "torch" (default: PyTorch's padding=1 on every 3x3 layer, an explicit
            one-pixel ZeroPadding2D before each stride-2 layer, so torchvision's weights
            give torchvision's outputs) or "same" (Keras's 'same' everywhere: the
            stride-2 layers sample a grid one pixel off on even sides, no PAD ops in
            LiteRT, 5-10% faster there; for nets trained from scratch).
        features_only: return the feature pyramid instead (like timm's
            `features_only=True`): a model whose output is the dict {"P2": ..., "P5": ...}
            of the maps that end the stem and stages 2-4 (strides 4, 8, 16, 32; the
            `pyramid_outputs` of `hub.ShuffleNetBackbone`). Needs `include_top=False`, no
            `pooling` and the ImageNet stem; `weights` load as without it.

    Returns:
        A `keras.Model`.

    Reference:
        - Ma et al., ShuffleNet V2, https://arxiv.org/abs/1807.11164
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """
    # `locals()` is exactly the arguments here; the learned-shuffle ones are fixed.
    return _shufflenet_v2(**locals(), **arguments.MANUAL_SHUFFLE_ARGUMENTS)


def AutoShuffleNetV2(
    width: float = 1.0,
    include_top: bool = True,
    weights: str | os.PathLike | None = None,
    input_tensor: Any = None,
    input_shape: tuple[int | None, ...] | None = None,
    pooling: Literal["avg", "max"] | None = None,
    classes: int = 1000,
    classifier_activation: str | Callable | None = "softmax",
    name: str | None = None,
    shuffle: Literal["manual", "auto"] = "auto",
    penalty: float = 1e-3,
    stem: Literal["auto", "imagenet", "cifar"] = "auto",
    shuffle_initializer: Literal["random", "manual"] = "random",
    padding: Literal["torch", "same"] = "torch",
    sinkhorn_iterations: int = 10,
    shuffle_forward: Literal["relaxed", "hard"] = "relaxed",
    shuffle_permutations: Mapping[str, Sequence[int]] | None = None,
    features_only: bool = False,
) -> keras.Model:
    """Instantiates the AutoShuffleNet v2 architecture.

    ShuffleNet v2 whose shuffles are learned (RelaxedShuffle, hardened after training).
    The architecture and defaults are `ShuffleNetV2`'s, so only the shuffles differ.

    Args:
        width: width multiplier, one of 0.5, 1.0, 1.5, 2.0 (default 1.0).
        include_top: whether to include the global pooling and the classifier.
        weights: as `ShuffleNetV2`'s; with "imagenet" (or a name) learned shuffles
            start at the manual shuffle (the pretrained net; `shuffle_initializer` is
            ignored). A learned-shuffle net also takes the file of the same net with manual
            shuffles (e.g. written by the `autoshuffle-convert-weights` command); its
            shuffles then start as `shuffle_initializer` says.
        input_tensor: optional Keras tensor (output of `keras.Input()`) as input.
        input_shape: optional shape tuple, e.g. (224, 224, 3); any channel count.
            Default: (224, 224, 3) with `include_top`, (None, None, 3) without.
        pooling: with `include_top=False`: None (4D feature map), "avg" or "max".
        classes: number of classes (with `include_top`).
        classifier_activation: activation of the "predictions" layer; None gives logits.
        name: model name (default `autoshufflenet_v2_<width>`, e.g.
            `autoshufflenet_v2_x1_0`).
        stem: "imagenet" (3x3 stride-2 conv + 3x3 stride-2 max-pool), "cifar" (3x3
            stride-1 conv, no max-pool) or "auto" ("cifar" when both spatial sides are
            at most 64).
        padding: "torch" or "same", as `ShuffleNetV2`'s.
        shuffle: "manual" (ChannelShuffle with 2 groups) or "auto" (RelaxedShuffle)
            (default "auto").
        penalty: lambda of the relaxed shuffles' l1-2 penalty (default 1e-3).
        shuffle_initializer: where learned shuffles start: "random" (the paper: |N(0, 1)|
            made doubly stochastic) or "manual" (the manual shuffle's permutation, so the
            net starts as the manual ShuffleNet: for fine-tuning pretrained weights, e.g.
            from `load_torchvision_weights`). Ignored by manual shuffles. The layer takes
            the same values: `RelaxedShuffle(shuffle_initializer="manual", groups=g)`.
        sinkhorn_iterations: clip/column/row passes of each learned shuffle's constraint
            per SGD step, an integer in [1, 1000] (default 10, as `RelaxedShuffle`). 1 is
            the paper's Algorithm 1, whose matrices stalled on fixed points that are not
            permutations, so rounding changed the net; with 10 they ended on
            permutations in docs/training.md's runs. Ignored by manual shuffles.
        shuffle_forward: what a learned shuffle computes while it trains: "relaxed" (the
            paper: y = M x) or "hard" (y = P x with P the nearest permutation of M, found
            by linear assignment at every step; the gradient passes straight through to
            M). Started at `shuffle_initializer="manual"` a hard net is the manual net at
            step 0 and changes a routing only where the loss moves M far enough. Ignored
            by manual shuffles.
        shuffle_permutations: a dict {shuffle layer name: permutation} that fixes every
            learned shuffle from the first step (the layers start hardened; e.g. the
            permutations of an earlier, hardened net: "search, then retrain"). Needs
            shuffle="auto"; one entry per shuffle layer.
        features_only: return the feature pyramid instead, as `ShuffleNetV2`'s.

    Returns:
        A `keras.Model`.

    Reference:
        - Ma et al., ShuffleNet V2, https://arxiv.org/abs/1807.11164
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """
    # `locals()` is exactly the arguments here: the private builder takes them all.
    return _shufflenet_v2(**locals())
