"""The exact inference transform: fold hardened (or manual) shuffles into the weights.

A permutation commutes with per-channel ops (BatchNormalization, ReLU, depthwise
convolution) and is absorbed by a 1x1 convolution (a dense one: any permutation of its
inputs or outputs; a grouped one: a permutation inside each group). `fold_model`
rebuilds a ShuffleNet v1 / v2 from `keras_autoshuffle.applications` so that no shuffle
moves data through a GATHER:

- v2: every channel is born in one branch (or a down-sampling unit's left branch) and
  consumed by exactly one later 1x1 conv. Each producer's output channels are ordered by
  the unit that consumes them, so each unit's branch input is one concat of contiguous
  slices, and the stage end one more concat. The identity half is never copied.
- v1: between the two grouped 1x1 convs only the g x g block counts of the permutation
  matter. The order inside each group folds into the convs; what remains is the manual
  reshape-transpose (`ChannelShuffle`) when the counts are the manual shuffle's (see
  `nearest_balanced_permutation`), nothing when every channel stays in its group, and
  otherwise a concat of g x g contiguous slices. A shuffle after an ungrouped conv
  (stage 2 unit 1) folds away completely.

The folded model is for inference: BatchNormalization keeps its (permuted) statistics
and is not fused, so it stays trainable as a Keras model but has no shuffles to learn.
"""

from typing import Any

import keras
import numpy as np
from keras import layers

from keras_autoshuffle import permutations
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.common import pyramid_outputs
from keras_autoshuffle.layers import (
    ChannelShuffle,
    ChannelSlice,
    ChannelSplit,
    RelaxedShuffle,
    shuffle_permutation,
)

# XNNPACK (LiteRT's CPU delegate) takes a concatenation of at most 5 inputs (ai-edge-litert
# 1.2.0 and 2.3.0: 6 or more fall outside the delegate).
_MAX_CONCAT_INPUTS = 5


def _concat(pieces, name):
    """Concatenates channels; larger concatenations than XNNPACK takes are nested rather
    than left outside the delegate."""
    level, most = 0, _MAX_CONCAT_INPUTS
    while len(pieces) > most:
        pieces = [
            layers.Concatenate(axis=-1, name=f"{name}{level}_{k}")(pieces[k : k + most])
            if len(pieces[k : k + most]) > 1
            else pieces[k]
            for k in range(0, len(pieces), most)
        ]
        level += 1
    return pieces[0] if len(pieces) == 1 else layers.Concatenate(axis=-1, name=name)(pieces)


def copy_layer(
    layer: keras.layers.Layer,
    inputs: Any,
    weights: list[np.ndarray] | None = None,
    name: str | None = None,
    **overrides: Any,
) -> Any:
    """A fresh layer with `layer`'s config (`overrides` and `name` replacing its fields)
    called on `inputs`, holding `weights` (default: `layer`'s own); its outputs.

    The one way the folded net and the LiteRT graph rewrite (`export.litert_graph`)
    copy a layer of a functional model into a new graph."""
    config = {**layer.get_config(), **overrides}
    if name is not None:
        config["name"] = name
    new = type(layer).from_config(config)
    outputs = new(inputs)
    new.set_weights(layer.get_weights() if weights is None else weights)
    return outputs


def _take(weights, index, axis=-1):
    return [np.take(w, index, axis=axis) for w in weights]


def _describe(model):
    """The model's `Architecture`; ValueError unless folding can take it."""
    if keras.config.image_data_format() != "channels_last" or any(
        getattr(layer, "data_format", "channels_last") != "channels_last" for layer in model.layers
    ):
        raise ValueError("Folding supports channels_last models only.")
    architecture = arch.describe(model)
    if architecture is None:
        raise ValueError(
            "fold_model expects a ShuffleNet v1 / v2 from keras_autoshuffle.applications. "
            f"Received: model={model.name!r}"
        )
    return architecture


def is_foldable(model: keras.Model) -> bool:
    """Whether `fold_model` takes `model`: a channels_last ShuffleNet v1 / v2 from
    `keras_autoshuffle.applications` with no relaxed shuffle left."""
    try:
        _describe(model)
    except ValueError:
        return False
    return not any(isinstance(x, RelaxedShuffle) and not x.is_hardened for x in model.layers)


def _apply_tail(model, x, after):
    """Applies the layers listed after `after` (a linear chain: pooling, classifier)."""
    names = [layer.name for layer in model.layers]
    for layer in model.layers[names.index(after) + 1 :]:
        x = copy_layer(layer, x)
    return x


def _copy_present(model, names, x):
    """`x` through copies of the layers of `names` that the model has (the ImageNet stem's
    and the paddings may be absent: `arch.PADS`)."""
    present = {layer.name for layer in model.layers}
    for name in names:
        if name in present:
            x = copy_layer(model.get_layer(name), x)
    return x


def _unit(model, stage, unit):
    """`part -> layer` for one unit, names from the shared architecture description."""
    return lambda part: model.get_layer(arch.unit_layer(stage, unit, part))


# ---------------------------------------------------------------- ShuffleNet v1


def _block_ranges(counts):
    """The canonical permutation with block counts `counts` (sources ordered by target) as
    the `(start, stop)` source ranges it reads, in output order."""
    groups = counts.shape[0]
    size = counts[:, 0].sum()
    ranges = []
    for b in range(groups):
        for a in range(groups):
            start = int(a * size + counts[a, :b].sum())
            if counts[a, b]:
                ranges.append((start, start + int(counts[a, b])))
    return ranges


def _block_route(counts):
    """The canonical permutation with block counts `counts`."""
    return np.concatenate([np.arange(*r) for r in _block_ranges(counts)]).astype(np.int64)


def _fold_v1_unit(model, stage, unit, x, route_manual):
    """Rebuilds one v1 unit's conv1 .. conv2 with its shuffle folded; returns conv2's BN out."""
    get = _unit(model, stage, unit)
    prefix = arch.unit_prefix(stage, unit)
    conv1, bn1, relu1 = get("conv1"), get("bn1"), get("relu1")
    dwconv, dwbn = get("dwconv"), get("dwbn")
    conv2, bn2 = get("conv2"), get("bn2")
    names = {layer.name for layer in model.layers}
    channels = conv1.filters
    perm = (
        shuffle_permutation(get(arch.SHUFFLE))
        if arch.unit_layer(stage, unit, arch.SHUFFLE) in names
        else np.arange(channels)
    )
    groups, route = conv2.groups, None
    # A dense conv on either side absorbs the whole permutation.
    if conv1.groups == 1:
        sigma, tau = perm, np.arange(channels)
    elif groups == 1:
        sigma, tau = np.arange(channels), perm
    else:
        counts = permutations.block_counts(perm, groups)
        manual = permutations.group_shuffle_permutation(channels, groups)
        if route_manual and np.array_equal(counts, permutations.block_counts(manual, groups)):
            canonical, route = manual, "manual"
        else:
            canonical, route = _block_route(counts), counts
        sigma, tau = permutations.decompose(perm, canonical, groups)
    # conv1's outputs (and bn1) reordered by sigma: inside groups, so conv1 stays grouped.
    kernel = conv1.get_weights()[0][..., sigma]
    x = copy_layer(conv1, x, [kernel, *_take(conv1.get_weights()[1:], sigma)])
    x = copy_layer(bn1, x, _take(bn1.get_weights(), sigma))
    x = copy_layer(relu1, x)
    if isinstance(route, str):
        x = ChannelShuffle(groups, name=arch.unit_layer(stage, unit, arch.SHUFFLE))(x)
    elif route is not None and not np.array_equal(_block_route(route), np.arange(channels)):
        x = _route_slices(x, route, prefix)
    # After the canonical shuffle, channel j feeds what tau^-1 sends it to.
    inverse = permutations.invert_permutation(tau)
    dw = dwconv.get_weights()
    x = _copy_present(model, [arch.unit_layer(stage, unit, arch.pad_name("dwconv"))], x)
    x = copy_layer(dwconv, x, [np.take(dw[0], inverse, axis=2), *_take(dw[1:], inverse)])
    x = copy_layer(dwbn, x, _take(dwbn.get_weights(), inverse))
    kernel = conv2.get_weights()[0]
    if conv2.groups == 1:
        new_kernel = kernel[:, :, inverse, :]
    else:
        # Grouped kernel (kh, kw, in/g, out): group G's outputs read inputs G*in/g + r.
        new_kernel = np.empty_like(kernel)
        in_size, out_size = channels // groups, conv2.filters // groups
        for group in range(groups):
            cols = slice(group * out_size, (group + 1) * out_size)
            local = inverse[group * in_size : (group + 1) * in_size] - group * in_size
            new_kernel[..., cols] = kernel[:, :, local, cols]
    x = copy_layer(conv2, x, [new_kernel, *conv2.get_weights()[1:]])
    return copy_layer(bn2, x)


def _route_slices(x, counts, prefix):
    """`_block_route(counts)` as one concat of contiguous slices (no GATHER)."""
    merged = []
    for start, stop in _block_ranges(counts):
        if merged and start == merged[-1][1]:
            merged[-1][1] = stop
        else:
            merged.append([start, stop])
    slices = [
        ChannelSlice(start, stop, name=f"{prefix}_route{k}")(x)
        for k, (start, stop) in enumerate(merged)
    ]
    return _concat(slices, f"{prefix}_route")


def _fold_v1(model, architecture, inputs, route_manual=True, ends=None):
    """The folded v1; `ends`, when a list, receives `(tensor, None)` for the stem and each
    stage's end (their channels keep the model's order: v1 folds inside each unit)."""
    x = _copy_present(model, arch.IMAGENET_STEM, inputs)
    ends = [] if ends is None else ends
    ends.append((x, None))
    last = None
    for stage, repeats in architecture.stages():
        for unit in range(1, repeats + 1):
            get = _unit(model, stage, unit)
            shortcut = x
            branch = _fold_v1_unit(model, stage, unit, x, route_manual)
            if unit == 1:
                branch = copy_layer(get("relu2"), branch)
                pad = arch.unit_layer(stage, unit, arch.pad_name("pool"))
                shortcut = _copy_present(model, [pad], shortcut)
                x = copy_layer(get("concat"), [copy_layer(get("pool"), shortcut), branch])
                last = get("concat").name
            else:
                x = copy_layer(get("relu2"), copy_layer(get("add"), [shortcut, branch]))
                last = get("relu2").name
        ends.append((x, None))
    return _apply_tail(model, x, last)


# ---------------------------------------------------------------- ShuffleNet v2


def _v2_plan(model, stage, repeats):
    """Where every channel of a v2 stage is born and which unit consumes it.

    Returns `(consumers, orders)`: `consumers[u]` (u = 2..repeats, and "end") lists
    (producer, channel) in the logical input order of that consumer; `orders[producer]`
    is a list of (consumer, channel) in the producer's new output order, grouped by
    consumer.
    """
    half = arch.v2_half(model, stage)
    consumers = {}
    for unit, state in enumerate(arch.v2_stage_sources(model, stage, repeats), start=1):
        perm = shuffle_permutation(_unit(model, stage, unit)(arch.SHUFFLE))
        output = [state[i] for i in perm]
        if unit < repeats:
            consumers[unit + 1] = output[half:]
        else:
            consumers["end"] = output
    rank = {key: r for r, key in enumerate([*range(2, repeats + 1), "end"])}
    orders = {}
    for consumer, channels in consumers.items():
        for position, (producer, channel) in enumerate(channels):
            orders.setdefault(producer, []).append((rank[consumer], position, consumer, channel))
    orders = {p: [(c, ch) for _, _, c, ch in sorted(v)] for p, v in orders.items()}
    return consumers, orders


def _producer_pieces(tensor, order, name):
    """Cuts a producer's output (channels grouped by consumer) into one piece per consumer.

    Returns {consumer: (piece, channels)}. Two equal pieces are one SPLIT (what
    balanced v2 hardening produces); otherwise each piece is a contiguous slice.
    """
    runs = []
    for k, (consumer, channel) in enumerate(order):
        if not runs or runs[-1][0] != consumer:
            runs.append((consumer, k, []))
        runs[-1][2].append(channel)
    if len(runs) == 1:
        return {runs[0][0]: (tensor, runs[0][2])}
    if len(runs) == 2 and len(runs[0][2]) == len(runs[1][2]):
        halves = ChannelSplit(name=f"{name}_split")(tensor)
        return {c: (piece, chans) for piece, (c, _, chans) in zip(halves, runs, strict=True)}
    return {
        consumer: (ChannelSlice(start, start + len(chans), name=f"{name}_slice{k}")(tensor), chans)
        for k, (consumer, start, chans) in enumerate(runs)
    }


def _gather_input(consumer, consumer_channels, pieces, name):
    """A consumer's input as one concat of its producers' pieces, and its row order.

    Returns `(x, rows)`: physical channel k of `x` is logical input `rows[k]`.
    """
    position = {key: q for q, key in enumerate(consumer_channels)}
    inputs, rows = [], []
    for producer, by_consumer in pieces.items():
        if consumer in by_consumer:
            piece, channels = by_consumer[consumer]
            inputs.append(piece)
            rows.extend(position[(producer, c)] for c in channels)
    return _concat(inputs, f"{name}_gather"), np.asarray(rows, dtype=np.int64)


def _present(get, parts):
    """The layers of `parts` the model has (paddings may be absent: `arch.PADS`)."""
    found = []
    for part in parts:
        try:
            found.append(get(part))
        except ValueError:
            if part not in arch.PADS:
                raise
    return found


def _v2_branch(get, unit, x, rows, columns):
    """conv1 .. relu2 with conv1's input rows and conv2's output columns permuted."""
    first, *middle, conv2, bn2, relu2 = _present(get, arch.branch_parts("v2", unit))
    weights = first.get_weights()
    x = copy_layer(first, x, [weights[0][:, :, rows, :], *weights[1:]])
    for layer in middle:  # BN, ReLU, padding, the depthwise conv and its BN: per channel
        x = copy_layer(layer, x)
    weights = conv2.get_weights()
    x = copy_layer(conv2, x, [weights[0][..., columns], *_take(weights[1:], columns)])
    x = copy_layer(bn2, x, _take(bn2.get_weights(), columns))
    return copy_layer(relu2, x)


def _v2_left(get, x, rows, columns):
    """The down unit's left branch with its input rows and output columns permuted."""
    *padding, dwconv, dwbn, conv, bn, relu = _present(get, arch.V2_LEFT)
    for layer in padding:
        x = copy_layer(layer, x)
    weights = dwconv.get_weights()
    x = copy_layer(dwconv, x, [np.take(weights[0], rows, axis=2), *_take(weights[1:], rows)])
    x = copy_layer(dwbn, x, _take(dwbn.get_weights(), rows))
    weights = conv.get_weights()
    x = copy_layer(conv, x, [weights[0][:, :, rows, :][..., columns], *_take(weights[1:], columns)])
    x = copy_layer(bn, x, _take(bn.get_weights(), columns))
    return copy_layer(relu, x)


def _fold_v2(model, architecture, inputs, ends=None):
    """The folded v2; `ends`, when a list, receives `(tensor, rows)` for the stem and each
    stage's end: physical channel k of the tensor is the model's channel `rows[k]`."""
    x = _copy_present(model, arch.IMAGENET_STEM, inputs)
    rows = np.arange(x.shape[-1])
    ends = [] if ends is None else ends
    ends.append((x, rows))
    for stage, repeats in architecture.stages():
        consumers, orders = _v2_plan(model, stage, repeats)
        get, prefix = _unit(model, stage, 1), arch.unit_prefix(stage, 1)
        columns = {p: np.asarray([c for _, c in order]) for p, order in orders.items()}
        pieces = {
            "left": _producer_pieces(
                _v2_left(get, x, rows, columns["left"]), orders["left"], f"{prefix}_left"
            ),
            1: _producer_pieces(_v2_branch(get, 1, x, rows, columns[1]), orders[1], prefix),
        }
        for unit in range(2, repeats + 1):
            prefix = arch.unit_prefix(stage, unit)
            branch_input, branch_rows = _gather_input(unit, consumers[unit], pieces, prefix)
            get = _unit(model, stage, unit)
            output = _v2_branch(get, unit, branch_input, branch_rows, columns[unit])
            pieces[unit] = _producer_pieces(output, orders[unit], prefix)
        x, rows = _gather_input("end", consumers["end"], pieces, f"stage{stage}_end")
        ends.append((x, rows))
    conv, bn, relu = (model.get_layer(name) for name in arch.V2_HEAD)
    weights = conv.get_weights()
    x = copy_layer(conv, x, [weights[0][:, :, rows, :], *weights[1:]])
    x = copy_layer(relu, copy_layer(bn, x))
    return _apply_tail(model, x, relu.name)


# ---------------------------------------------------------------- entry point


def fold_model(
    model: keras.Model, route_manual: bool = True, name: str | None = None
) -> keras.Model:
    """An equivalent inference model with every shuffle folded into the weights.

    Args:
        model: a ShuffleNet v1 / v2 from `keras_autoshuffle.applications` (channels_last)
            whose shuffles are manual or hardened.
        route_manual: v1 only; keep a `ChannelShuffle` (the cheap reshape-transpose) for
            permutations with the manual block counts instead of routing them by slices.
        name: the new model's name (default `<model.name>_folded`).

    Returns:
        A `keras.Model` with the same outputs (up to float rounding) and no GATHER.

    Example:
        >>> model = AutoShuffleNetV2(input_shape=(32, 32, 3), classes=10)
        >>> harden_model(model)
        >>> inference = fold_model(model)
    """
    _check_model_and_name(model, name)
    if not isinstance(route_manual, bool):  # a truthy string would silently mean True
        raise TypeError(
            f"`route_manual` must be True or False. Received: route_manual={route_manual!r}"
        )
    inputs, outputs = _fold(model, route_manual)
    return keras.Model(inputs, outputs, name=name or f"{model.name}_folded")


def _check_model_and_name(model, name):
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model. Received: model={model!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"`name` must be a string or None. Received: name={name!r}")


def _fold(model, route_manual=True, ends=None):
    """`(inputs, outputs)` of the folded `model` (its shuffles checked first); `ends`, a
    list, receives each stage end's tensor and channel order."""
    architecture = _describe(model)
    for layer in model.layers:
        if isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
            shuffle_permutation(layer)
    inputs = keras.Input(shape=model.inputs[0].shape[1:])
    if architecture.family == "v1":
        return inputs, _fold_v1(model, architecture, inputs, route_manual, ends=ends)
    return inputs, _fold_v2(model, architecture, inputs, ends=ends)


def fold_pyramid(model: keras.Model, name: str | None = None) -> keras.Model:
    """`fold_model` for the feature pyramid: a model whose output is the dict P2-P5 of
    `applications.common.pyramid_outputs(model)` (equal up to float rounding), every
    shuffle folded into the weights.

    A folded v2 stage end holds its channels in the order the next units read them; one
    fixed gather per level (3, not one per unit) puts back the model's order, which a
    detector's or segmenter's head was trained on. v1 stage ends keep the model's order.

    Args:
        model: a ShuffleNet v1 / v2 from `keras_autoshuffle.applications` (or a
            `hub.ShuffleNetBackbone`), channels_last, ImageNet stem, manual or hardened
            shuffles.
        name: the new model's name (default `<model.name>_folded_pyramid`).

    Returns:
        A `keras.Model` with outputs {"P2": ..., "P5": ...}.

    Example:
        >>> features = fold_pyramid(ShuffleNetBackbone.from_preset("shufflenet_v2_x1_0_imagenet"))
    """
    _check_model_and_name(model, name)
    levels = tuple(pyramid_outputs(model))  # refuses the CIFAR stem, by name
    ends = []
    inputs, _ = _fold(model, ends=ends)
    outputs = {}
    for level, (x, rows) in zip(levels, ends, strict=True):
        if rows is not None and not np.array_equal(rows, np.arange(len(rows))):
            # y[..., j] = x[..., k] where rows[k] == j: the model's channel order.
            x = RelaxedShuffle(permutation=np.argsort(rows), name=f"{level}_order")(x)
        outputs[level] = x
    return keras.Model(inputs, outputs, name=name or f"{model.name}_folded_pyramid")


def count_gathers(model: keras.Model) -> int:
    """How many shuffle GATHERs (hardened RelaxedShuffle layers) a model holds."""
    return sum(isinstance(layer, RelaxedShuffle) and layer.is_hardened for layer in model.layers)
