"""The public builders' signature and docstring, written once.

`ARGUMENTS` holds each argument both families take, with its default and its Args text;
`public_builders` makes a family's `ShuffleNetVx` and `AutoShuffleNetVx` from it and the
family's own entries, so the four builders share every name, default and text.
"""

import inspect
import textwrap

import keras

# The arguments both families take, in signature order after the family's own ones
# (`width`; v1: `groups`): name -> (default, Args text). A family replaces an entry's
# text where it says more (v2's `weights`); "{shuffle}" and "{prefix}" are the
# variant's default shuffle and model-name prefix.
ARGUMENTS = {
    "include_top": (True, "whether to include the global pooling and the classifier."),
    "weights": (
        None,
        "None (random initialization) or the path to a Keras weights file "
        "(`.weights.h5`). A learned-shuffle net also takes the file of the same net with "
        "manual shuffles (e.g. written by `scripts/convert_torchvision_weights.py`); its "
        "shuffles then start as `shuffle_initializer` says.",
    ),
    "input_tensor": (None, "optional Keras tensor (output of `keras.Input()`) as input."),
    "input_shape": (
        None,
        "optional shape tuple, e.g. (224, 224, 3); any channel count. Default: "
        "(224, 224, 3) with `include_top`, (None, None, 3) without.",
    ),
    "pooling": (None, 'with `include_top=False`: None (4D feature map), "avg" or "max".'),
    "classes": (1000, "number of classes (with `include_top`)."),
    "classifier_activation": (
        "softmax",
        'activation of the "predictions" layer; None gives logits.',
    ),
    "name": (None, "model name (default `{prefix}_<width>`, e.g. `{prefix}_x1_0`)."),
    "shuffle": (
        "manual",
        '"manual" (ChannelShuffle) or "auto" (RelaxedShuffle) (default "{shuffle}").',
    ),
    "penalty": (1e-3, "lambda of the relaxed shuffles' l1-2 penalty (default 1e-3)."),
    "stem": (
        "auto",
        '"imagenet" (3x3 stride-2 conv + 3x3 stride-2 max-pool), "cifar" (3x3 stride-1 '
        'conv, no max-pool) or "auto" ("cifar" when both spatial sides are at most 64).',
    ),
    "shuffle_initializer": (
        "random",
        'where learned shuffles start: "random" (the paper: |N(0, 1)| made doubly '
        'stochastic) or "manual" (the manual shuffle\'s permutation, so the net starts as '
        "the manual ShuffleNet: for fine-tuning pretrained weights, e.g. from "
        "`load_torchvision_weights`). Ignored by manual shuffles. The layer takes the "
        'same values: `RelaxedShuffle(shuffle_initializer="manual", groups=g)`.',
    ),
    "padding": (
        "torch",
        '"torch" (default: PyTorch\'s padding=1 on every 3x3 layer, an explicit one-pixel '
        "ZeroPadding2D before each stride-2 layer, so torchvision's weights give "
        "torchvision's outputs) or \"same\" (Keras's 'same' everywhere: the stride-2 layers "
        "sample a grid one pixel off on even sides, no PAD ops in LiteRT, 5-10% faster "
        "there; for nets trained from scratch).",
    ),
    "sinkhorn_iterations": (
        10,
        "clip/column/row passes of each learned shuffle's constraint per SGD step, an "
        "integer in [1, 1000] (default 10). 1 is the paper's Algorithm 1, whose matrices "
        "stalled on fixed points that are not permutations, so rounding changed the net; "
        "with 10 they ended on permutations in docs/training.md's runs. Ignored by manual "
        "shuffles.",
    ),
    "shuffle_forward": (
        "relaxed",
        'what a learned shuffle computes while it trains: "relaxed" (the paper: y = M x) '
        'or "hard" (y = P x with P the nearest permutation of M, found by linear '
        "assignment at every step; the gradient passes straight through to M). Started "
        'at `shuffle_initializer="manual"` a hard net is the manual net at step 0 and '
        "changes a routing only where the loss moves M far enough. Ignored by manual "
        "shuffles.",
    ),
    "shuffle_permutations": (
        None,
        "a dict {{shuffle layer name: permutation}} that fixes every learned shuffle from "
        "the first step (the layers start hardened; e.g. the permutations of an earlier, "
        'hardened net: "search, then retrain"). Needs shuffle="auto"; one entry per '
        "shuffle layer.",
    ),
}

DOCSTRING = """Instantiates the {title} architecture.

{summary}

    Args:
{arguments}

    Returns:
        A `keras.Model`.

    Reference:
        - {reference}
        - Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624
"""


def model_prefix(version, shuffle):
    """`shufflenet_v1` for manual shuffles, `autoshufflenet_v1` for learned ones."""
    return f"{'auto' if shuffle == 'auto' else ''}shufflenet_{version}"


def _fill(text, first, rest):
    """`text` with its white space folded, wrapped for `help()` after the given indents."""
    return textwrap.fill(
        " ".join(text.split()),
        width=92,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


def public_builders(build, version, source, description, family_arguments, reference):
    """A family's two public builders, `ShuffleNet<V>` and `AutoShuffleNet<V>` (shuffles
    "manual" and "auto" by default).

    Each has a signature (what `help()` and `inspect.signature` show) listing every
    argument by keyword with its default, the family's own first, then `ARGUMENTS`'
    order; a call binds to it as to a written-out `def` (positional arguments, TypeError
    on unknown keywords) and goes to `build`, the family's private builder.

    Args:
        build: the private builder, taking every argument by keyword.
        version: "v1" or "v2".
        source: whose network the manual builder makes, e.g. "megvii".
        description: the architecture in a few sentences (white space is folded).
        family_arguments: {name: (default, Args text)}: the family's own arguments, then
            texts that replace the shared ones.
        reference: the family's paper.
    """
    own = {key: entry for key, entry in family_arguments.items() if key not in ARGUMENTS}
    table = {**own, **ARGUMENTS, **family_arguments}  # shared entries keep their place
    return tuple(
        _public_builder(build, version, source, description, table, reference, shuffle)
        for shuffle in ("manual", "auto")
    )


def _public_builder(build, version, source, description, table, reference, shuffle):
    table = {**table, "shuffle": (shuffle, table["shuffle"][1])}
    signature = inspect.Signature(
        [
            inspect.Parameter(key, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
            for key, (default, _) in table.items()
        ],
        return_annotation=keras.Model,
    )

    learned = shuffle == "auto"
    title = f"{'Auto' if learned else ''}ShuffleNet {version}"
    name = title.replace(" v", "V")

    def builder(*args, **kwargs):
        try:
            call = signature.bind(*args, **kwargs)
        except TypeError as error:  # Python's wording, with the builder's name as a def's
            raise TypeError(f"{name}() {error}") from None
        call.apply_defaults()
        return build(**call.arguments)

    builder.__name__ = builder.__qualname__ = name
    builder.__module__ = build.__module__
    builder.__signature__ = signature
    if learned:
        summary = (
            f"ShuffleNet {version} whose shuffles are learned (RelaxedShuffle, hardened after "
            "training). The same defaults as the manual builder, so only the shuffles differ."
        )
    else:
        summary = f"The {source} network with a fixed channel shuffle by default."
    fields = {"shuffle": shuffle, "prefix": model_prefix(version, shuffle)}
    builder.__doc__ = DOCSTRING.format(
        title=title,
        summary=_fill(f"{summary} {description}", "    ", "    "),
        arguments="\n".join(
            _fill(text.format(**fields), f"        {key}: ", " " * 12)
            for key, (_, text) in table.items()
        ),
        reference=reference,
    )
    return builder
