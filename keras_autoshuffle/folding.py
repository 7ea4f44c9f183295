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

import itertools
import time

import keras
import numpy as np
from keras import layers

from keras_autoshuffle import permutations
from keras_autoshuffle.applications.common import ChannelSplit
from keras_autoshuffle.layers import ChannelShuffle, RelaxedShuffle


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ChannelSlice(keras.layers.Layer):
    """Contiguous channels `inputs[..., start:stop]` (channels_last): a LiteRT SLICE.

    Args:
        start: first channel, a non-negative integer.
        stop: one past the last channel, greater than `start`.
    """

    def __init__(self, start, stop, **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
            raise ValueError(
                "`start` and `stop` must be integers with 0 <= start < stop. "
                f"Received: start={start}, stop={stop}"
            )
        self.start, self.stop = start, stop

    def build(self, input_shape):
        if input_shape[-1] is None or input_shape[-1] < self.stop:
            raise ValueError(
                f"ChannelSlice(stop={self.stop}) needs at least {self.stop} channels. "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs):
        return inputs[..., self.start : self.stop]

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.stop - self.start)

    def get_config(self):
        return {**super().get_config(), "start": self.start, "stop": self.stop}


def _concat(pieces, name):
    """Concatenates channels; XNNPACK (LiteRT's CPU delegate) takes at most 4 inputs per
    concat, so larger ones are nested rather than left outside the delegate."""
    level = 0
    while len(pieces) > 4:
        pieces = [
            layers.Concatenate(axis=-1, name=f"{name}{level}_{k}")(pieces[k : k + 4])
            if len(pieces[k : k + 4]) > 1
            else pieces[k]
            for k in range(0, len(pieces), 4)
        ]
        level += 1
    return pieces[0] if len(pieces) == 1 else layers.Concatenate(axis=-1, name=name)(pieces)


def _permutation_of(layer):
    if isinstance(layer, RelaxedShuffle) and not layer.is_hardened:
        raise ValueError(
            f"Shuffle '{layer.name}' is still relaxed: harden the model before folding "
            "(keras_autoshuffle.harden_model)."
        )
    if not isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
        raise ValueError(f"Layer '{layer.name}' is not a shuffle layer.")
    return np.asarray(layer.permutation, dtype=np.int64)


def _copy(layer, inputs, weights=None, name=None, **overrides):
    """A fresh layer with `layer`'s config (and `weights`, default its own) applied."""
    config = {**layer.get_config(), **overrides}
    if name is not None:
        config["name"] = name
    new = type(layer).from_config(config)
    outputs = new(inputs)
    new.set_weights(layer.get_weights() if weights is None else weights)
    return outputs


def _take(weights, index, axis=-1):
    return [np.take(w, index, axis=axis) for w in weights]


def architecture(model):
    """ "v1" or "v2" for a ShuffleNet from `keras_autoshuffle.applications` (by its layer
    names), else None."""
    names = {layer.name for layer in model.layers}
    if "stage2_unit1_left_dwconv" in names:
        return "v2"
    if "stage2_unit1_pool" in names:
        return "v1"
    return None


def _family(model):
    if keras.config.image_data_format() != "channels_last" or any(
        getattr(layer, "data_format", "channels_last") != "channels_last" for layer in model.layers
    ):
        raise ValueError("Folding supports channels_last models only.")
    family = architecture(model)
    if family is None:
        raise ValueError(
            "fold_model expects a ShuffleNet v1 / v2 from keras_autoshuffle.applications. "
            f"Received: model={model.name!r}"
        )
    return family


def is_foldable(model):
    """Whether `fold_model` takes `model`: a channels_last ShuffleNet v1 / v2 from
    `keras_autoshuffle.applications` with no relaxed shuffle left."""
    try:
        _family(model)
    except ValueError:
        return False
    return not any(isinstance(x, RelaxedShuffle) and not x.is_hardened for x in model.layers)


def _units(model):
    """{stage: number of units} from the layer names."""
    units = {}
    for layer in model.layers:
        parts = layer.name.split("_")
        if len(parts) > 2 and parts[0].startswith("stage") and parts[1].startswith("unit"):
            stage, unit = int(parts[0][5:]), int(parts[1][4:])
            units[stage] = max(units.get(stage, 0), unit)
    return dict(sorted(units.items()))


def _apply_tail(model, x, after):
    """Applies the layers listed after `after` (a linear chain: pooling, classifier)."""
    names = [layer.name for layer in model.layers]
    for layer in model.layers[names.index(after) + 1 :]:
        x = _copy(layer, x)
    return x


def _stem(model, x):
    for name in ("stem_conv", "stem_bn", "stem_relu", "stem_pool"):
        if name in {layer.name for layer in model.layers}:
            x = _copy(model.get_layer(name), x)
    return x


def shuffle_groups(model):
    """{shuffle layer name: g} for the shuffles whose block counts matter when folding.

    A ShuffleNet v1 shuffle between two grouped 1x1 convs (g > 1) gets g; one after an
    ungrouped conv (stage 2 unit 1, or g = 1) gets None: any permutation folds away
    there. v2 shuffles get None (slices fold any permutation). Other models: None.
    """
    names = {layer.name for layer in model.layers}
    groups = {}
    for layer in model.layers:
        if not isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
            continue
        prefix = layer.name.removesuffix("_shuffle")
        conv1, conv2 = f"{prefix}_conv1", f"{prefix}_conv2"
        g = None
        if conv1 in names and conv2 in names and "stage2_unit1_pool" in names:
            g1, g2 = model.get_layer(conv1).groups, model.get_layer(conv2).groups
            if g1 == g2 and g1 > 1:
                g = g1
        groups[layer.name] = g
    return groups


# ---------------------------------------------------------------- ShuffleNet v1


def _block_route(counts):
    """The canonical permutation with block counts `counts` (sources ordered by target)."""
    groups = counts.shape[0]
    size = counts[:, 0].sum()
    perm = []
    for b in range(groups):
        for a in range(groups):
            start = a * size + counts[a, :b].sum()
            perm.extend(range(start, start + counts[a, b]))
    return np.asarray(perm, dtype=np.int64)


def decompose(perm, canonical, groups):
    """Splits `perm` into within-group permutations around `canonical`.

    For permutations with the same block counts, returns `(sigma, tau)`, both
    permuting channels only inside their group, with `perm[i] == sigma[canonical[tau[i]]]`.
    """
    perm, canonical = np.asarray(perm), np.asarray(canonical)
    counts = permutations.block_counts(perm, groups)
    if not np.array_equal(counts, permutations.block_counts(canonical, groups)):
        raise ValueError("`perm` and `canonical` must have the same block counts.")
    size = perm.size // groups
    target = np.arange(perm.size) // size
    tau = np.empty_like(perm)
    for b in range(groups):
        for a in range(groups):
            mine = np.flatnonzero((target == b) & (perm // size == a))
            theirs = np.flatnonzero((target == b) & (canonical // size == a))
            tau[mine] = theirs
    sigma = np.empty_like(perm)
    sigma[canonical[tau]] = perm
    return sigma, tau


def _fold_v1_unit(model, prefix, x, route_manual):
    """Rebuilds one v1 unit's conv1 .. conv2 with its shuffle folded; returns conv2's BN out."""
    get = model.get_layer
    conv1, bn1, relu1 = get(f"{prefix}_conv1"), get(f"{prefix}_bn1"), get(f"{prefix}_relu1")
    dwconv, dwbn = get(f"{prefix}_dwconv"), get(f"{prefix}_dwbn")
    conv2, bn2 = get(f"{prefix}_conv2"), get(f"{prefix}_bn2")
    names = {layer.name for layer in model.layers}
    channels = conv1.filters
    perm = (
        _permutation_of(get(f"{prefix}_shuffle"))
        if f"{prefix}_shuffle" in names
        else np.arange(channels)
    )
    groups = conv2.groups
    if conv1.groups == 1 or groups == 1:
        # A dense conv on either side absorbs the whole permutation.
        if conv1.groups == 1:
            sigma, tau, route = perm, np.arange(channels), None
        else:
            sigma, tau, route = np.arange(channels), perm, None
    else:
        counts = permutations.block_counts(perm, groups)
        manual = permutations.group_shuffle_permutation(channels, groups)
        if route_manual and np.array_equal(counts, permutations.block_counts(manual, groups)):
            canonical, route = manual, "manual"
        else:
            canonical, route = _block_route(counts), counts
        sigma, tau = decompose(perm, canonical, groups)
    # conv1's outputs (and bn1) reordered by sigma: inside groups, so conv1 stays grouped.
    kernel = conv1.get_weights()[0][..., sigma]
    x = _copy(conv1, x, [kernel, *_take(conv1.get_weights()[1:], sigma)])
    x = _copy(bn1, x, _take(bn1.get_weights(), sigma))
    x = _copy(relu1, x)
    if isinstance(route, str):
        x = ChannelShuffle(groups, name=f"{prefix}_shuffle")(x)
    elif route is not None and not np.array_equal(_block_route(route), np.arange(channels)):
        x = _route_slices(x, route, prefix)
    # After the canonical shuffle, channel j feeds what tau^-1 sends it to.
    inverse = permutations.invert_permutation(tau)
    dw = dwconv.get_weights()
    x = _copy(dwconv, x, [np.take(dw[0], inverse, axis=2), *_take(dw[1:], inverse)])
    x = _copy(dwbn, x, _take(dwbn.get_weights(), inverse))
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
    x = _copy(conv2, x, [new_kernel, *conv2.get_weights()[1:]])
    return _copy(bn2, x)


def _route_slices(x, counts, prefix):
    """`_block_route(counts)` as one concat of contiguous slices (no GATHER)."""
    groups = counts.shape[0]
    size = counts[:, 0].sum()
    pieces = []
    for b in range(groups):
        for a in range(groups):
            if counts[a, b]:
                start = int(a * size + counts[a, :b].sum())
                pieces.append((start, start + int(counts[a, b])))
    merged = [list(pieces[0])]
    for start, stop in pieces[1:]:
        if start == merged[-1][1]:
            merged[-1][1] = stop
        else:
            merged.append([start, stop])
    slices = [
        ChannelSlice(start, stop, name=f"{prefix}_route{k}")(x)
        for k, (start, stop) in enumerate(merged)
    ]
    return _concat(slices, f"{prefix}_route")


def _fold_v1(model, inputs, route_manual=True):
    x = _stem(model, inputs)
    last = None
    for stage, repeats in _units(model).items():
        for unit in range(1, repeats + 1):
            prefix = f"stage{stage}_unit{unit}"
            shortcut = x
            branch = _fold_v1_unit(model, prefix, x, route_manual)
            if unit == 1:
                branch = _copy(model.get_layer(f"{prefix}_relu2"), branch)
                pooled = _copy(model.get_layer(f"{prefix}_pool"), shortcut)
                x = _copy(model.get_layer(f"{prefix}_concat"), [pooled, branch])
                last = f"{prefix}_concat"
            else:
                x = _copy(model.get_layer(f"{prefix}_add"), [shortcut, branch])
                x = _copy(model.get_layer(f"{prefix}_relu2"), x)
                last = f"{prefix}_relu2"
    return _apply_tail(model, x, last)


# ---------------------------------------------------------------- ShuffleNet v2


def _v2_stage_inputs(model, stage, last):
    """The channels entering shuffles 1..`last` of a v2 stage, as (producer, channel) keys.

    Producers: "left" and 1 (the down unit's two branches) and u for the basic units'
    branches. Shuffles before `last` must be manual or hardened.
    """
    half = model.get_layer(f"stage{stage}_unit1_conv2").filters
    inputs = [[("left", k) for k in range(half)] + [(1, k) for k in range(half)]]
    for u in range(1, last):
        perm = _permutation_of(model.get_layer(f"stage{stage}_unit{u}_shuffle"))
        inputs.append([inputs[-1][i] for i in perm][:half] + [(u + 1, k) for k in range(half)])
    return inputs


def _v2_plan(model, stage, repeats):
    """Where every channel of a v2 stage is born and which unit consumes it.

    Returns `(consumers, orders)`: `consumers[u]` (u = 2..repeats, and "end") lists
    (producer, channel) in the logical input order of that consumer; `orders[producer]`
    is a list of (consumer, channel) in the producer's new output order, grouped by
    consumer.
    """
    half = model.get_layer(f"stage{stage}_unit1_conv2").filters
    consumers = {}
    for unit, state in enumerate(_v2_stage_inputs(model, stage, repeats), start=1):
        perm = _permutation_of(model.get_layer(f"stage{stage}_unit{unit}_shuffle"))
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


def _v2_branch(model, prefix, x, rows, columns):
    """conv1 .. relu2 with conv1's input rows and conv2's output columns permuted."""
    get = model.get_layer
    conv1 = get(f"{prefix}_conv1")
    weights = conv1.get_weights()
    x = _copy(conv1, x, [weights[0][:, :, rows, :], *weights[1:]])
    for suffix in ("bn1", "relu1", "dwconv", "dwbn"):
        x = _copy(get(f"{prefix}_{suffix}"), x)
    conv2, bn2 = get(f"{prefix}_conv2"), get(f"{prefix}_bn2")
    weights = conv2.get_weights()
    x = _copy(conv2, x, [weights[0][..., columns], *_take(weights[1:], columns)])
    x = _copy(bn2, x, _take(bn2.get_weights(), columns))
    return _copy(get(f"{prefix}_relu2"), x)


def _v2_left(model, prefix, x, rows, columns):
    """The down unit's left branch with its input rows and output columns permuted."""
    get = model.get_layer
    dwconv, dwbn = get(f"{prefix}_left_dwconv"), get(f"{prefix}_left_dwbn")
    weights = dwconv.get_weights()
    x = _copy(dwconv, x, [np.take(weights[0], rows, axis=2), *_take(weights[1:], rows)])
    x = _copy(dwbn, x, _take(dwbn.get_weights(), rows))
    conv, bn = get(f"{prefix}_left_conv"), get(f"{prefix}_left_bn")
    weights = conv.get_weights()
    x = _copy(conv, x, [weights[0][:, :, rows, :][..., columns], *_take(weights[1:], columns)])
    x = _copy(bn, x, _take(bn.get_weights(), columns))
    return _copy(get(f"{prefix}_left_relu"), x)


def _fold_v2(model, inputs):
    x = _stem(model, inputs)
    rows = np.arange(x.shape[-1])
    for stage, repeats in _units(model).items():
        consumers, orders = _v2_plan(model, stage, repeats)
        prefix = f"stage{stage}_unit1"
        columns = {p: np.asarray([c for _, c in order]) for p, order in orders.items()}
        pieces = {
            "left": _producer_pieces(
                _v2_left(model, prefix, x, rows, columns["left"]), orders["left"], f"{prefix}_left"
            ),
            1: _producer_pieces(_v2_branch(model, prefix, x, rows, columns[1]), orders[1], prefix),
        }
        for unit in range(2, repeats + 1):
            prefix = f"stage{stage}_unit{unit}"
            branch_input, branch_rows = _gather_input(unit, consumers[unit], pieces, prefix)
            output = _v2_branch(model, prefix, branch_input, branch_rows, columns[unit])
            pieces[unit] = _producer_pieces(output, orders[unit], prefix)
        x, rows = _gather_input("end", consumers["end"], pieces, f"stage{stage}_end")
    conv = model.get_layer("head_conv")
    weights = conv.get_weights()
    x = _copy(conv, x, [weights[0][:, :, rows, :], *weights[1:]])
    x = _copy(model.get_layer("head_bn"), x)
    x = _copy(model.get_layer("head_relu"), x)
    return _apply_tail(model, x, "head_relu")


def _v2_shuffle_position(model, shuffle_name):
    """(stage, unit, repeats) of a v2 shuffle layer name."""
    if _family(model) != "v2":
        raise ValueError(
            f"Balanced v2 hardening needs a ShuffleNet v2. Received: model={model.name!r}"
        )
    names = {layer.name for layer in model.layers}
    parts = str(shuffle_name).split("_")
    units = _units(model)
    if len(parts) != 3 or shuffle_name not in names or parts[2] != "shuffle":
        raise ValueError(
            "`shuffle_name` must name one of the model's 'stageS_unitK_shuffle' layers. "
            f"Received: shuffle_name={shuffle_name!r}"
        )
    stage, unit = int(parts[0].removeprefix("stage")), int(parts[1].removeprefix("unit"))
    return stage, unit, units[stage]


def nearest_balanced_v2_permutation(model, shuffle_name, matrix, time_limit=None):
    """The nearest permutation for a v2 shuffle whose folded routing is SPLIT + CONCAT.

    Balanced v2 hardening keeps the folded routing as lean as the same net with no
    shuffle: every unit's output is cut at most once, into two equal halves, each
    consumed whole by one later unit, so each unit costs at most one SPLIT (its
    output) and one CONCAT (its branch input). For the shuffle after unit K this
    means: every block waiting in the identity half (the kept part of an earlier
    unit's output) goes wholly to the identity or wholly to the next branch (a block
    that is a whole output may also go half to each side), and unit K's output goes
    wholly to one side or half to each. After the down-sampling unit, the left and
    right branches go one wholly to each side, or half and half: the manual
    shuffle's 2 x 2 block counts (`nearest_balanced_permutation` with 2 groups). The
    last shuffle of a stage is free: the stage end takes every channel in any order.

    Each option is an exact linear assignment with forbidden entries, or the
    two-group balanced problem; the best option is returned. It is optimal for this
    layer given the earlier shuffles of its stage, which must be hardened first
    (harden in network order): they define the blocks.

    Args:
        model: a ShuffleNet v2 from `keras_autoshuffle.applications`.
        shuffle_name: the shuffle layer's name, `stageS_unitK_shuffle`.
        matrix: its N x N relaxed matrix.
        time_limit: seconds for the mixed-integer program (None: proven optimal).

    Returns:
        `(perm, info)`; info has `mass`, `optimal` and `seconds`.
    """
    start = time.perf_counter()
    matrix = permutations._as_square(matrix)
    stage, unit, repeats = _v2_shuffle_position(model, shuffle_name)
    channels = 2 * model.get_layer(f"stage{stage}_unit1_conv2").filters
    if matrix.shape[0] != channels:
        raise ValueError(
            f"`matrix` must be {channels} x {channels} for {shuffle_name!r}. "
            f"Received: matrix.shape={matrix.shape}"
        )
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"`time_limit` must be positive. Received: time_limit={time_limit}")
    if unit == repeats:
        perm = permutations.nearest_permutation(matrix)
        return perm, _v2_info(matrix, perm, True, start)
    state = _v2_stage_inputs(model, stage, unit)[-1]
    producers = {}
    for position, (producer, _) in enumerate(state):
        producers.setdefault(producer, []).append(position)
    # Identity-half blocks: each earlier producer's channels still waiting (none in unit 1).
    blocks = [np.asarray(p) for producer, p in producers.items() if unit > 1 and producer != unit]
    perm, optimal = _nearest_v2_routed(matrix, blocks, time_limit)
    return perm, _v2_info(matrix, perm, optimal, start)


def _nearest_v2_routed(matrix, blocks, time_limit=None):
    """The nearest permutation that keeps a v2 shuffle's folded routing SPLIT + CONCAT.

    Sources 0..h-1 are the identity half, h..n-1 the fresh branch output; targets
    0..h-1 are the next identity half, h..n-1 the next branch. Each of `blocks`
    (arrays of identity sources) goes wholly to one side; the fresh output goes
    wholly to one side or half to each. With no blocks (after the down unit, whose
    two branches are both fresh) the two halves go one wholly to each side, or half
    and half (`nearest_balanced_permutation` with 2 groups). A block that is a whole
    earlier output (half the channels) may also go half to each side. Returns
    `(perm, optimal)`; keeping every block and sending the fresh output to the branch
    is always an option.
    """
    n = matrix.shape[0]
    half = n // 2
    if not blocks:
        blocks = [np.arange(half)]  # the left branch; the right one takes the other side
    candidates, optimal = [], True
    for chosen in itertools.product((False, True), repeat=len(blocks)):
        # chosen[b]: block b goes to the next branch (targets half..n-1).
        fresh_to_branch = half - sum(b.size for b, c in zip(blocks, chosen, strict=True) if c)
        if fresh_to_branch not in (0, half) and 2 * fresh_to_branch != half:
            continue
        allowed = np.ones((n, n), dtype=bool)
        for block, to_branch in zip(blocks, chosen, strict=True):
            allowed[slice(0, half) if to_branch else slice(half, n), block] = False
        try:
            candidates.append(permutations.nearest_permutation(matrix, allowed=allowed))
        except ValueError:  # infeasible: more than half the targets asked of one side
            continue
    if len(blocks) == 1 and blocks[0].size == half and half % 2 == 0:
        try:
            perm, info = permutations.nearest_balanced_permutation(
                matrix, 2, time_limit=time_limit, return_info=True
            )
            candidates.append(perm)
            optimal = info["optimal"]
        except RuntimeError:  # HiGHS stopped without a permutation (kept as a safeguard)
            optimal = False
    return max(candidates, key=lambda p: permutations.matched_mass(matrix, p)), optimal


def _v2_info(matrix, perm, optimal, start):
    return {
        "mass": permutations.matched_mass(matrix, perm),
        "optimal": bool(optimal),
        "seconds": time.perf_counter() - start,
    }


# ---------------------------------------------------------------- entry point


def fold_model(model, route_manual=True, name=None):
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
        >>> model = ShuffleNetV2(shuffle="auto", input_shape=(32, 32, 3), classes=10)
        >>> harden_model(model)
        >>> inference = fold_model(model)
    """
    family = _family(model)
    for layer in model.layers:
        if isinstance(layer, (RelaxedShuffle, ChannelShuffle)):
            _permutation_of(layer)
    inputs = keras.Input(shape=model.inputs[0].shape[1:])
    if family == "v1":
        outputs = _fold_v1(model, inputs, route_manual)
    else:
        outputs = _fold_v2(model, inputs)
    return keras.Model(inputs, outputs, name=name or f"{model.name}_folded")


def count_gathers(model):
    """How many shuffle GATHERs (hardened RelaxedShuffle layers) a model holds."""
    return sum(isinstance(layer, RelaxedShuffle) and layer.is_hardened for layer in model.layers)
