"""The four public builders' docstring, written once (as keras.applications' BASE_DOCSTRING).

`BASE_DOCSTRING.format(...)` is each builder's `__doc__`; `builder_docstring` fills it
from the family's texts. The family modules (`shufflenet_v1`, `shufflenet_v2`) hold the
texts that differ: their own arguments, `weights`, `shuffle`, the architecture.
"""

BASE_DOCSTRING = """Instantiates the {title} architecture.

    {summary}

    Args:
{own_arguments}
        include_top: whether to include the global pooling and the classifier.
        weights: {weights}
        input_tensor: optional Keras tensor (output of `keras.Input()`) as input.
        input_shape: optional shape tuple, e.g. (224, 224, 3); any channel count.
            Default: (224, 224, 3) with `include_top`, (None, None, 3) without.
        pooling: with `include_top=False`: None (4D feature map), "avg" or "max".
        classes: number of classes (with `include_top`).
        classifier_activation: activation of the "predictions" layer; None gives logits.
        name: model name (default `{name_pattern}`,
            e.g. `{name_example}`).
        stem: "imagenet" (3x3 stride-2 conv + 3x3 stride-2 max-pool), "cifar" (3x3
            stride-1 conv, no max-pool) or "auto" ("cifar" when both spatial sides are
            at most 64).
        padding: "torch" (default: PyTorch's padding=1 on every 3x3 layer, an explicit
            one-pixel ZeroPadding2D before each stride-2 layer, so torchvision's weights
            give torchvision's outputs) or "same" (Keras's 'same' everywhere: the
            stride-2 layers sample a grid one pixel off on even sides, no PAD ops in
            LiteRT, 5-10% faster there; for nets trained from scratch).
{learned_arguments}
    Returns:
        A `keras.Model`.

    Reference:
        - {reference}
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
"""

# The Args entries of the arguments only `AutoShuffleNetV1/V2` take.
LEARNED_ARGUMENTS = """        shuffle: {shuffle} (default "{shuffle_default}").
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
        shuffle_permutations: a dict {{shuffle layer name: permutation}} that fixes every
            learned shuffle from the first step (the layers start hardened; e.g. the
            permutations of an earlier, hardened net: "search, then retrain"). Needs
            shuffle="auto"; one entry per shuffle layer.
"""


def builder_docstring(
    version: str,
    learned: bool,
    source: str,
    description: str,
    own_arguments: str,
    weights: str,
    shuffle: str,
    name: str,
    reference: str,
) -> str:
    """`BASE_DOCSTRING` for one builder.

    Args:
        version: "v1" or "v2".
        learned: True for `AutoShuffleNet<V>` (shuffle "auto" by default).
        source: whose network the manual builder makes, e.g. "megvii".
        description: the architecture, lines indented by 4 spaces after the first.
        own_arguments: the family's own Args entries, indented as in `BASE_DOCSTRING`.
        weights: the family's text of this argument (lines after the first indented by
            12 spaces).
        shuffle: the family's text of the `shuffle` argument, as `weights`.
        name: the default model name's pattern after the prefix, e.g. `_g<groups>_<width>`.
        reference: the family's paper.
    """
    prefix = f"{'auto' if learned else ''}shufflenet_{version}"
    if learned:
        summary = (
            f"ShuffleNet {version} whose shuffles are learned (RelaxedShuffle, hardened\n"
            "    after training). The same defaults as the manual builder, so only the\n"
            "    shuffles differ."
        )
    else:
        summary = (
            f"The {source} network, its channel shuffles fixed (ChannelShuffle); learned\n"
            f"    shuffles: `AutoShuffleNet{version.upper()}`, which takes the same arguments and\n"
            "    the learned shuffles' own."
        )
    example = name.replace("<groups>", "3").replace("<width>", "x1_0")
    return BASE_DOCSTRING.format(
        title=f"{'Auto' if learned else ''}ShuffleNet {version}",
        summary=f"{summary}\n\n    {description}",
        own_arguments=own_arguments,
        weights=weights,
        name_pattern=prefix + name,
        name_example=prefix + example,
        learned_arguments=(
            LEARNED_ARGUMENTS.format(shuffle=shuffle, shuffle_default="auto") if learned else ""
        ),
        reference=reference,
    )
