"""The ShuffleNet v1 / v2 layer structure, written once.

The builders name their layers with `unit_prefix` and the part names below; folding and
balanced hardening find layers with the same names through `describe(model)`, never by
parsing names. `describe` checks that every layer the description expects is there, so a
layer renamed in a builder and not here fails loudly instead of folding a wrong network
(tests/test_applications.py compares each built model's layers with this description).
"""

import dataclasses
from typing import Any

from keras_autoshuffle.layers import shuffle_permutation

# The layer names other modules rely on (folding, torchvision conversion, balanced
# hardening, the weights checks): written here once, read from here.
STEM_CONV, STEM_BN, STEM_RELU, STEM_POOL = "stem_conv", "stem_bn", "stem_relu", "stem_pool"
HEAD_CONV, HEAD_BN, HEAD_RELU = "head_conv", "head_bn", "head_relu"
AVG_POOL, MAX_POOL, PREDICTIONS = "avg_pool", "max_pool", "predictions"
# A unit's learned or manual shuffle: `unit_layer(stage, unit, SHUFFLE)`.
SHUFFLE = "shuffle"


def pad_name(name):
    """The ZeroPadding2D before the stride-2 layer `name` (see `applications/common.py`)."""
    return f"{name}_pad"


# Stem (the paddings and the pool only with the ImageNet stem) and v2 head. A `<layer>_pad`
# (ZeroPadding2D) precedes every stride-2 layer.
STEM = (STEM_CONV, STEM_BN, STEM_RELU)
IMAGENET_STEM = (pad_name(STEM_CONV), *STEM, pad_name(STEM_POOL), STEM_POOL)
V2_HEAD = (HEAD_CONV, HEAD_BN, HEAD_RELU)
# The first words of every layer name a builder gives (an `input_tensor` may bring other
# layers along).
OWN_PREFIXES = ("stem_", "stage", "head_", PREDICTIONS)

# v2: the down-sampling unit's left branch, the branch of every unit, the basic unit's
# channel split, and the join (concat, then the shuffle).
V2_LEFT = ("left_dwconv_pad", "left_dwconv", "left_dwbn", "left_conv", "left_bn", "left_relu")
V2_BRANCH = ("conv1", "bn1", "relu1", "dwconv_pad", "dwconv", "dwbn", "conv2", "bn2", "relu2")
V2_SPLIT = "split"
V2_JOIN = ("concat", SHUFFLE)

# v1: the bottleneck branch (the shuffle is absent from manual g=1 units); the
# down-sampling unit joins an average-pooled shortcut by concat, the others add.
V1_BRANCH = ("conv1", "bn1", "relu1", SHUFFLE, "dwconv_pad", "dwconv", "dwbn", "conv2", "bn2")
V1_OPTIONAL = (SHUFFLE,)
V1_DOWN_JOIN = ("relu2", "pool_pad", "pool", "concat")
# Parts that only a down-sampling unit (unit 1, stride 2) has.
DOWN_ONLY = ("dwconv_pad",)
# Paddings: models saved before they existed ('same' padding) lack them, and are still
# described (and folded) as they were built.
PADS = tuple(pad_name(name) for name in (STEM_CONV, STEM_POOL, "left_dwconv", "dwconv", "pool"))
V1_JOIN = ("add", "relu2")

# Every part name a unit can have.
UNIT_PARTS = frozenset(
    (*V2_LEFT, *V2_BRANCH, V2_SPLIT, *V2_JOIN, *V1_BRANCH, *V1_DOWN_JOIN, *V1_JOIN)
)
FAMILIES = ("v1", "v2")

# Units per stage 2, 3, 4 (both families).
REPEATS = (4, 8, 4)
# v2 width: stem, stage2, stage3, stage4, head (torchvision `shufflenet_v2_x*`).
V2_CONFIGS = {
    0.5: (24, 48, 96, 192, 1024),
    1.0: (24, 116, 232, 464, 1024),
    1.5: (24, 176, 352, 704, 1024),
    2.0: (24, 244, 488, 976, 2048),
}
V2_WIDTHS = (0.5, 1.0, 1.5, 2.0)  # V2_CONFIGS's keys (a test checks)
# v1: stage-2 output width at 1.0x per groups (the paper's Table 1; stages 3, 4 double it).
V1_STAGE2_WIDTHS = {1: 144, 2: 200, 3: 240, 4: 272, 8: 384}
V1_GROUPS = (1, 2, 3, 4, 8)  # V1_STAGE2_WIDTHS's keys (a test checks)
V1_WIDTHS = (0.25, 0.5, 1.0, 1.5, 2.0)
# torchvision's ImageNet statistics (inputs scaled to [0, 1] first).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def width_name(width):
    """`1.5` -> `"x1_5"`, torchvision's variant suffix."""
    return "x" + f"{float(width):g}".replace(".", "_") + ("_0" if float(width).is_integer() else "")


def unit_prefix(stage, unit):
    """`stage2_unit1`: the prefix of every layer of one unit."""
    return f"stage{stage}_unit{unit}"


def part_layer(prefix, part):
    """The name of `part` (e.g. "conv1") in the unit named `prefix` (`unit_prefix`);
    ValueError for a part no unit has (a name written outside this table)."""
    if part not in UNIT_PARTS:
        raise ValueError(
            f"`part` must be a unit part of applications/architecture.py. Received: part={part!r}"
        )
    return f"{prefix}_{part}"


def unit_layer(stage, unit, part):
    """The name of `part` (e.g. "conv1") in unit `unit` of stage `stage`."""
    return part_layer(unit_prefix(stage, unit), part)


def branch_parts(family, unit):
    """The part names of one unit's branch (conv1 .. the last BN or ReLU), in order."""
    parts = V2_BRANCH if family == "v2" else V1_BRANCH
    return tuple(part for part in parts if unit == 1 or part not in DOWN_ONLY)


def unit_parts(family, unit):
    """The part names of one unit, in data-flow order."""
    branch = branch_parts(family, unit)
    if family == "v2":
        if unit == 1:
            return (*V2_LEFT, *branch, *V2_JOIN)
        return (V2_SPLIT, *branch, *V2_JOIN)
    return (*branch, *(V1_DOWN_JOIN if unit == 1 else V1_JOIN))


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A built ShuffleNet's family and units per stage (stages 2, 3, 4, ...)."""

    family: str
    repeats: tuple

    def stages(self) -> list[tuple[int, int]]:
        """`(stage, units)` pairs, stage 2 first."""
        return list(enumerate(self.repeats, start=2))

    def stage_ends(self) -> list[str]:
        """The names of the layers that end stages 2, 3, 4, ... (their last units' last)."""
        return [
            unit_layer(s, units, unit_parts(self.family, units)[-1]) for s, units in self.stages()
        ]

    def shuffle_position(self, name: str) -> tuple[int, int]:
        """`(stage, unit)` of the shuffle layer called `name`; ValueError otherwise."""
        for stage, units in self.stages():
            for unit in range(1, units + 1):
                if unit_layer(stage, unit, SHUFFLE) == name:
                    return stage, unit
        raise ValueError(
            f"`shuffle_name` must name a shuffle layer of this ShuffleNet {self.family}. "
            f"Received: shuffle_name={name!r}"
        )


def describe(model: Any) -> "Architecture | None":
    """The `Architecture` of a ShuffleNet built by `keras_autoshuffle.applications`.

    Returns None for other models. Raises ValueError when the model looks like a
    ShuffleNet but lacks layers the description expects (a renamed layer).
    """
    names = {layer.name for layer in getattr(model, "layers", [])}
    if unit_layer(2, 1, "left_dwconv") in names:
        family = "v2"
    elif unit_layer(2, 1, "pool") in names:
        family = "v1"
    else:
        return None
    repeats = []
    while unit_layer(len(repeats) + 2, 1, "conv1") in names:
        stage, units = len(repeats) + 2, 1
        while unit_layer(stage, units + 1, "conv1") in names:
            units += 1
        repeats.append(units)
    architecture = Architecture(family, tuple(repeats))
    missing = [
        unit_layer(stage, unit, part)
        for stage, units in architecture.stages()
        for unit in range(1, units + 1)
        for part in unit_parts(family, unit)
        if part not in (*PADS, *(V1_OPTIONAL if family == "v1" else ()))
        and unit_layer(stage, unit, part) not in names
    ]
    missing += [name for name in (*STEM, *(V2_HEAD if family == "v2" else ())) if name not in names]
    if missing:
        raise ValueError(
            f"The model looks like a ShuffleNet {family} but lacks layers of the description "
            f"in applications/architecture.py (renamed?). Received: missing layers {missing[:5]}"
        )
    return architecture


def v1_shuffle_groups(model, architecture):
    """{shuffle name: g} for a v1's shuffles; g where both neighbouring 1x1 convs are
    grouped with g > 1 (the block counts then matter), else None (folds away)."""
    groups = {}
    for stage, units in architecture.stages():
        for unit in range(1, units + 1):
            name = unit_layer(stage, unit, SHUFFLE)
            if name not in {layer.name for layer in model.layers}:
                continue
            g1 = model.get_layer(unit_layer(stage, unit, "conv1")).groups
            g2 = model.get_layer(unit_layer(stage, unit, "conv2")).groups
            groups[name] = g1 if g1 == g2 and g1 > 1 else None
    return groups


def v2_stage_sources(model, stage, last):
    """The channels entering shuffles 1..`last` of a v2 stage, as (producer, channel) keys.

    Producers are "left" and 1 (the down-sampling unit's two branches) and u for the
    branch of basic unit u. Shuffles before `last` must be manual or hardened.
    """
    half = model.get_layer(unit_layer(stage, 1, "conv2")).filters
    sources = [[("left", k) for k in range(half)] + [(1, k) for k in range(half)]]
    for unit in range(1, last):
        perm = shuffle_permutation(model.get_layer(unit_layer(stage, unit, SHUFFLE)))
        sources.append([sources[-1][i] for i in perm][:half] + [(unit + 1, k) for k in range(half)])
    return sources


def v2_half(model, stage):
    """Half the channels of a v2 stage (what each branch produces)."""
    return int(model.get_layer(unit_layer(stage, 1, "conv2")).filters)
