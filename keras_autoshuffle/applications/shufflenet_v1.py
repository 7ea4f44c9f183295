"""ShuffleNet v1 and AutoShuffleNet v1 (megvii official architecture).

Layer names, in order (S = stage 2..4, K = unit 1..repeats):

    stem:  stem_conv, stem_bn, stem_relu (cifar stem) or stem_conv_pad, stem_conv,
           stem_bn, stem_relu, stem_pool_pad, stem_pool (imagenet stem)
    every unit:
        stageS_unitK_conv1 (1x1, grouped except in stage2_unit1), _bn1, _relu1,
        stageS_unitK_shuffle (see below), _dwconv_pad (unit 1 only), _dwconv (3x3,
        stride 2 in unit 1), _dwbn, stageS_unitK_conv2 (1x1 grouped), _bn2
    down-sampling unit (K = 1): stageS_unit1_relu2 (branch), stageS_unit1_pool_pad,
        stageS_unit1_pool (3x3 stride-2 average pool of the unit input),
        stageS_unit1_concat ([pool, branch])
    basic unit (K > 1): stageS_unitK_add (input + branch), stageS_unitK_relu2
    head:  avg_pool, predictions (include_top) or avg_pool / max_pool (pooling);
           v1 has no head convolution.

The bottleneck is `out // 4` for the stage's output width `out`, computed before a
down-sampling unit subtracts its input channels from the branch output.

`_shuffle` sits between the first 1x1 conv (+BN+ReLU) and the depthwise conv, where the
paper's Figs. put it (megvii's code shuffles after the depthwise conv + BN; for a fixed
permutation the two are the same network up to a permutation of the depthwise weights).
"manual": ChannelShuffle(groups) when groups > 1, no layer when groups == 1 (megvii).
"auto": a RelaxedShuffle in every unit, for groups == 1 too (there it learns a mixing /
permutation between the 1x1 conv and the depthwise conv; hardened, it folds into conv1).

Padding: as megvii's code (PyTorch's padding=1 on every 3x3 layer), or Keras's 'same'
with `padding="same"`: see `common._pad` and `Options.pool` (the average-pool shortcut).

Initialisation: Keras's defaults, except the classifier (N(0, 0.01), as megvii) and the
last BatchNormalization of each basic unit's branch (gamma 0: the unit starts as the
identity, so training at the paper's learning rates does not diverge; see `_unit`).
"""

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import keras
from keras import layers

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import architecture, arguments, common

# The stage-2 widths per groups (`architecture.V1_STAGE2_WIDTHS`) are those at 1.0x.
STEM_WIDTH = 24
# (groups, width): stem, stage2, stage3, stage4, exactly as megvii's ShuffleNetV1 code.
# Other pairs scale the 1.0x widths (stem included) and round them: see `v1_channels`.
MEGVII_CONFIGS = {
    (3, 0.5): (12, 120, 240, 480),
    (3, 1.0): (24, 240, 480, 960),
    (3, 1.5): (24, 360, 720, 1440),
    (3, 2.0): (48, 480, 960, 1920),
    (8, 0.5): (16, 192, 384, 768),
    (8, 1.0): (24, 384, 768, 1536),
    (8, 1.5): (24, 576, 1152, 2304),
    (8, 2.0): (48, 768, 1536, 3072),
}


def v1_channels(groups, width):
    """(stem, stage2, stage3, stage4) output channels for `groups` and `width`.

    megvii's table where it has the pair; otherwise rounded as `ShuffleNetV1` says.
    """
    if (groups, width) in MEGVII_CONFIGS:
        return MEGVII_CONFIGS[groups, width]

    def nearest(value, divisor):
        return max(divisor, int(value / divisor + 0.5) * divisor)

    base = architecture.V1_STAGE2_WIDTHS[groups]
    stages = tuple(nearest(base * 2**i * width, 4 * groups) for i in range(3))
    return (nearest(STEM_WIDTH * width, groups), *stages)


def _unit(inputs, filters, groups, stride, first_group, options, prefix):
    """One unit: `inputs` -> `filters` channels; stride 2 concats an avg-pool shortcut."""
    bottleneck = filters // 4
    branch = filters - inputs if stride == 2 else filters
    bn = common.batch_norm
    name = functools.partial(architecture.part_layer, prefix)

    def apply(x):
        shortcut = x
        x = options.conv(bottleneck, 1, name("conv1"), groups=1 if first_group else groups)(x)
        x = bn(name("bn1"))(x)
        x = layers.ReLU(name=name("relu1"))(x)
        if options.shuffle == "auto" or groups > 1:
            x = options.shuffle_layer(groups, name("shuffle"))(x)
        x = options.dwconv(stride, name("dwconv"))(x)
        x = bn(name("dwbn"))(x)
        x = options.conv(branch, 1, name("conv2"), groups=groups)(x)
        # The residual branch starts at zero (Goyal et al., 2017): each unit starts as
        # the identity. With gamma 1 the sum grows unit by unit and training at lr 0.1
        # diverged in its first steps (digits: loss 2.3 -> 59 in 7 steps, 54% after 10
        # epochs). Only the initial value differs from megvii's ShuffleNet v1.
        x = bn(name("bn2"), "zeros" if stride == 1 else "ones")(x)
        if stride == 1:
            x = layers.Add(name=name("add"))([shortcut, x])
            return layers.ReLU(name=name("relu2"))(x)
        x = layers.ReLU(name=name("relu2"))(x)
        shortcut = options.pool("avg", name("pool"))(shortcut)
        return layers.Concatenate(axis=_validation.channel_axis(), name=name("concat"))(
            [shortcut, x]
        )

    return apply


def _shufflenet_v1(*, width, groups, channels=None, repeats=None, prefix=None, **shared):
    """The builder behind `ShuffleNetV1` / `AutoShuffleNetV1`, as `_shufflenet_v2` is v2's
    (`shared`, `prefix`, the `rebuild` for the manual twin). `channels` (stem, stage2,
    stage3, stage4; each stage a multiple of 4 x groups) and `repeats` replace the width's
    configuration (tests: `channels=(6, 24, 48, 96), repeats=(1, 1, 1)`, g=3).
    """
    family = {"width": width, "groups": groups, "channels": channels, "repeats": repeats}
    rebuild = functools.partial(_shufflenet_v1, prefix=prefix, **family)
    options = arguments.check_shared_arguments(shared)
    groups = _validation.choice(groups, architecture.V1_GROUPS, "groups")
    if channels is None:
        width = _validation.choice(width, architecture.V1_WIDTHS, "width")
        channels = v1_channels(groups, width)
    else:
        channels = arguments.check_config(channels, 4, "channels")
        arguments.check_config(channels[1:], 3, "channels[1:]", multiple=4 * groups)
    repeats = architecture.REPEATS if repeats is None else repeats
    repeats = arguments.check_config(repeats, 3, "repeats")
    inputs, x, stem = arguments.resolve_input(
        shared["input_tensor"], shared["input_shape"], shared["include_top"], shared["stem"]
    )
    image_shape = tuple(x.shape[1:])

    x = common.stem(channels[0], stem, options)(x)
    in_channels = channels[0]
    for stage, (filters, units) in enumerate(zip(channels[1:], repeats, strict=True), 2):
        for unit in range(1, units + 1):
            stride = 2 if unit == 1 else 1
            first_group = stage == 2 and unit == 1
            prefix_ = architecture.unit_prefix(stage, unit)
            x = _unit(in_channels, filters, groups, stride, first_group, options, prefix_)(x)
            in_channels = filters

    prefix = prefix or common.model_prefix("v1", shared["shuffle"])
    name = shared["name"] or f"{prefix}_g{groups}_{architecture.width_name(width)}"
    return common.finish(inputs, x, name, rebuild, shared, options, image_shape)


@arguments.manual_only
def ShuffleNetV1(
    width: float = 1.0,
    groups: int = 3,
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
    """Instantiates the ShuffleNet v1 architecture.

    The megvii network, its channel shuffles fixed (ChannelShuffle); learned shuffles:
    `AutoShuffleNetV1`, which takes the same arguments and the learned shuffles' own.

    Stage repeats 4, 8, 4. Stage-2 width at 1.0x by groups: g1 144, g2 200,
    g3 240, g4 272, g8 384 (stages 3, 4 double it), stem 24. For g3 and g8 the widths
    0.5, 1.5, 2.0 use megvii's tables; other pairs scale every 1.0x width by `width` and
    round it to the nearest multiple of 4 x groups (the stem: of groups), so every
    bottleneck (stage width // 4) and grouped convolution divides by `groups` and every
    pair builds (g3 0.25x is osmr's 6, 60, 120, 240; see `v1_channels`).
    BatchNormalization uses momentum 0.9, epsilon 1e-5 (PyTorch's defaults).

    Args:
        width: width multiplier, one of 0.25, 0.5, 1.0, 1.5, 2.0 (default 1.0).
        groups: groups of the 1x1 convolutions, one of 1, 2, 3, 4, 8 (default 3).
        include_top: whether to include the global pooling and the classifier.
        weights: None (random initialization) or the path to a Keras weights file
            (`.weights.h5`).
        input_tensor: optional Keras tensor (output of `keras.Input()`) as input.
        input_shape: optional shape tuple, e.g. (224, 224, 3); any channel count.
            Default: (224, 224, 3) with `include_top`, (None, None, 3) without.
        pooling: with `include_top=False`: None (4D feature map), "avg" or "max".
        classes: number of classes (with `include_top`).
        classifier_activation: activation of the "predictions" layer; None gives logits.
        name: model name (default `shufflenet_v1_g<groups>_<width>`,
            e.g. `shufflenet_v1_g3_x1_0`).
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
        - Zhang et al., ShuffleNet, https://arxiv.org/abs/1707.01083
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """
    # `locals()` is exactly the arguments here; the learned-shuffle ones are fixed.
    return _shufflenet_v1(**locals(), **arguments.MANUAL_SHUFFLE_ARGUMENTS)


def AutoShuffleNetV1(
    width: float = 1.0,
    groups: int = 3,
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
    """Instantiates the AutoShuffleNet v1 architecture.

    ShuffleNet v1 whose shuffles are learned (RelaxedShuffle, hardened after training).
    The architecture and defaults are `ShuffleNetV1`'s, so only the shuffles differ.

    Args:
        width: width multiplier, one of 0.25, 0.5, 1.0, 1.5, 2.0 (default 1.0).
        groups: groups of the 1x1 convolutions, one of 1, 2, 3, 4, 8 (default 3).
        include_top: whether to include the global pooling and the classifier.
        weights: None (random initialization) or the path to a Keras weights file
            (`.weights.h5`). A learned-shuffle net also takes the file of the same net
            with manual shuffles; its shuffles then start as `shuffle_initializer` says.
        input_tensor: optional Keras tensor (output of `keras.Input()`) as input.
        input_shape: optional shape tuple, e.g. (224, 224, 3); any channel count.
            Default: (224, 224, 3) with `include_top`, (None, None, 3) without.
        pooling: with `include_top=False`: None (4D feature map), "avg" or "max".
        classes: number of classes (with `include_top`).
        classifier_activation: activation of the "predictions" layer; None gives logits.
        name: model name (default `autoshufflenet_v1_g<groups>_<width>`,
            e.g. `autoshufflenet_v1_g3_x1_0`).
        stem: "imagenet" (3x3 stride-2 conv + 3x3 stride-2 max-pool), "cifar" (3x3
            stride-1 conv, no max-pool) or "auto" ("cifar" when both spatial sides are
            at most 64).
        padding: "torch" or "same", as `ShuffleNetV1`'s.
        shuffle: "manual" (ChannelShuffle(groups), none for groups=1) or "auto"
            (RelaxedShuffle in every unit) (default "auto").
        penalty: lambda of the relaxed shuffles' l1-2 penalty (default 1e-3).
        shuffle_initializer: "random" or "manual", as `AutoShuffleNetV2`'s.
        sinkhorn_iterations: an integer in [1, 1000] (default 10), as `AutoShuffleNetV2`'s.
        shuffle_forward: "relaxed" or "hard", as `AutoShuffleNetV2`'s.
        shuffle_permutations: {shuffle layer name: permutation}, as `AutoShuffleNetV2`'s.
        features_only: return the feature pyramid instead, as `ShuffleNetV1`'s.

    Returns:
        A `keras.Model`.

    Reference:
        - Zhang et al., ShuffleNet, https://arxiv.org/abs/1707.01083
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
    """
    # `locals()` is exactly the arguments here: the private builder takes them all.
    return _shufflenet_v1(**locals())
