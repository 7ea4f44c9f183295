"""What a hardened shuffle is: its routing counts (the canonical form of a permutation).

- ShuffleNet v1: between the two grouped 1x1 convs only per-channel ops run, so the
  order of channels inside each group is absorbed by the convs' weights. A shuffle there
  is exactly its g x g block counts (`permutations.block_counts`: how many channels go
  from source group a to target group b).
- ShuffleNet v2: every channel order is absorbed by the next 1x1 conv, so the shuffles of
  a stage are exactly how many channels each producer (the down-sampling unit's two
  branches, then each unit's branch) sends to each consumer (each later unit's branch,
  and the stage end).

Two hardened networks with the same counts are the same function class; a permutation
with the manual shuffle's counts (what balanced hardening returns) is the manual network
re-parametrised. `routing_difference` says how far learned shuffles are from manual.
"""

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.layers import shuffle_permutation
from keras_autoshuffle.permutations import block_counts, group_shuffle_permutation


def v2_stage_counts(
    perms: Sequence[ArrayLike], half: int
) -> tuple[list[str | int], list[int | str], np.ndarray]:
    """Producer -> consumer channel counts of one v2 stage with shuffles `perms`.

    Args:
        perms: the stage's shuffle permutations in unit order (`y[i] = x[perm[i]]`).
        half: channels per branch (half the stage width).

    Returns:
        `(producers, consumers, counts)`: producers "left", 1, ..., R (unit branches),
            consumers 2, ..., R and "end"; `counts[p, c]` channels of producer p read by c.
    """
    repeats = len(perms)
    producers = ["left", *range(1, repeats + 1)]
    consumers = [*range(2, repeats + 1), "end"]
    counts = np.zeros((len(producers), len(consumers)), dtype=np.int64)
    sources = [("left", k) for k in range(half)] + [(1, k) for k in range(half)]
    for unit, perm in enumerate(perms, start=1):
        output = [sources[i] for i in perm]
        last = unit == repeats
        for producer, _ in output if last else output[half:]:
            counts[producers.index(producer), consumers.index("end" if last else unit + 1)] += 1
        sources = output[:half] + [(unit + 1, k) for k in range(half)]
    return producers, consumers, counts


def routing_counts(model: keras.Model) -> list[dict[str, Any]]:
    """The canonical form of every manual or hardened shuffle of a ShuffleNet.

    Returns:
        A list of entries, one per v1 shuffle between grouped convs (`name`, `groups`,
            `counts`, `manual`: the manual shuffle's counts) or one per v2 stage (`stage`,
            `producers`, `consumers`, `counts`, `manual`). Counts are int arrays.
    """
    architecture = arch.describe(model)
    if architecture is None:
        raise ValueError(
            "routing_counts expects a ShuffleNet v1 / v2 from keras_autoshuffle.applications. "
            f"Received: model={getattr(model, 'name', model)!r}"
        )
    entries = []
    if architecture.family == "v1":
        for name, groups in arch.v1_shuffle_groups(model, architecture).items():
            if groups:
                perm = shuffle_permutation(model.get_layer(name))
                manual = group_shuffle_permutation(perm.size, groups)
                entries.append(
                    {
                        "name": name,
                        "groups": groups,
                        "counts": block_counts(perm, groups),
                        "manual": block_counts(manual, groups),
                    }
                )
        return entries
    for stage, units in architecture.stages():
        half = arch.v2_half(model, stage)
        perms = [
            shuffle_permutation(model.get_layer(arch.unit_layer(stage, unit, arch.SHUFFLE)))
            for unit in range(1, units + 1)
        ]
        manual = [group_shuffle_permutation(2 * half, 2)] * units
        producers, consumers, counts = v2_stage_counts(perms, half)
        entries.append(
            {
                "stage": stage,
                "producers": producers,
                "consumers": consumers,
                "counts": counts,
                "manual": v2_stage_counts(manual, half)[2],
            }
        )
    return entries


def routing_difference(model: keras.Model) -> float:
    """The fraction of routed channels whose route differs from the manual shuffle's.

    `sum |counts - manual| / (2 * sum counts)` over all entries of `routing_counts`:
    0 for the manual network (or any re-parametrisation of it), 1 when no channel goes
    where the manual shuffle sends it.
    """
    entries = routing_counts(model)
    moved = sum(np.abs(e["counts"] - e["manual"]).sum() for e in entries)
    total = sum(e["counts"].sum() for e in entries)
    return float(moved / (2 * total)) if total else 0.0
