"""Hardening a model: every relaxed shuffle rounded to an exact permutation, with a report.

`harden_model` is a model transform (as Keras's `Model.quantize`); `harden_and_evaluate`
adds the accuracy before and after rounding (the paper's Table 3), and is what the
`HardenShuffles` callback and the multi-worker training loop both call.
"""

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_autoshuffle import _keras_internals, _validation
from keras_autoshuffle import permutations as perm_math
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.hardening.balanced import nearest_balanced_permutation
from keras_autoshuffle.hardening.balanced_v2 import nearest_balanced_v2_permutation
from keras_autoshuffle.layers import attach_state, checked_permutation, relaxed_shuffles


def shuffle_groups(model: keras.Model) -> dict[str, int | None]:
    """{shuffle layer name: g} for the shuffles whose block counts matter when folding.

    A ShuffleNet v1 shuffle between two grouped 1x1 convs (g > 1) gets g; one after an
    ungrouped conv (stage 2 unit 1, or g = 1) gets None: any permutation folds away
    there. v2 shuffles get None (slices fold any permutation), other models {}.
    """
    architecture = arch.describe(model)
    if architecture is None:
        return {}
    if architecture.family == "v1":
        return arch.v1_shuffle_groups(model, architecture)
    return {
        arch.unit_layer(stage, unit, arch.SHUFFLE): None
        for stage, units in architecture.stages()
        for unit in range(1, units + 1)
    }


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}")
    if not model.built:
        raise ValueError(
            f"`model` must be built before it is hardened. Received: unbuilt model {model.name!r}"
        )


def harden_model(
    model: keras.Model,
    balanced: bool | dict[str, int | None] = False,
    time_limit: float | None = None,
    permutations: dict[str, Sequence[int] | np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """Hardens every relaxed shuffle of `model` in place; returns a per-layer report.

    Each entry holds the layer name, `channels`, its `l12_penalty` P(M) and its
    Frobenius `distance` to the chosen permutation, whether argmax rounding agrees, and
    the `permutation`. The model's compiled functions are rebuilt or reset, since the
    hardened layers trace to a different graph.

    All or nothing: every permutation is computed and checked before any layer changes,
    so on an error (a non-finite matrix, a bad `permutations` entry) the model, its
    optimizer and its compiled functions are left as they were.

    Args:
        model: a built model with RelaxedShuffle layers.
        balanced: False for the nearest permutation (linear assignment). True for
            balanced hardening, whose permutations fold into a graph as cheap as the
            manual one: each ShuffleNet v1 shuffle between two grouped convs gets the
            nearest permutation with the manual shuffle's g x g block counts
            (`nearest_balanced_permutation`; groups from `shuffle_groups(model)`, or
            pass a dict {layer name: groups or None}); each ShuffleNet v2 shuffle the
            nearest one whose folded routing is one SPLIT and one CONCAT per unit
            (`nearest_balanced_v2_permutation`, groups reported as 2). Entries then add
            `groups`, `mass` and `plain_mass` (matched mass of the balanced and the
            plain nearest permutation), `plain_distance`, `optimal` and `seconds`.
            A shuffle acts only through its routing counts (`routing_counts`): in v1
            a balanced permutation has the manual counts, so the network becomes the
            manual one re-parametrised, not the learned routing; in v2 it is the
            nearest routing in a cheap family (each output cut at most in halves),
            which differs from both the learned and the manual routing.
        time_limit: seconds per layer for the balanced solver; it then returns the
            best balanced permutation found so far (`optimal` False if not proven).
            None: prove optimality (can take minutes for wide layers).
        permutations: {layer name: permutation} for every relaxed shuffle, applied
            instead of rounding (e.g. a recorded hardening); `balanced` then does not
            apply.
    """
    _check_model(model)
    if not isinstance(balanced, (bool, dict)):
        raise ValueError(
            f"`balanced` must be True, False or a dict of groups. Received: balanced={balanced!r}"
        )
    time_limit = _validation.optional_positive_float(time_limit, "time_limit")
    # Mid-fit on JAX the weights are held outside the variables: attach them first. The
    # trainer then rebuilds its state from the variables at the next step.
    attach_state(model)
    layers = relaxed_shuffles(model)
    if permutations is not None:
        permutations = check_permutations(model, permutations)
        balanced = False
    architecture = arch.describe(model)
    v2 = balanced is True and architecture is not None and architecture.family == "v2"
    if balanced is True and not v2:
        balanced = shuffle_groups(model)
    chosen, report = _choose(model, layers, balanced, v2, permutations, time_limit)
    for layer, perm in zip(layers, chosen, strict=True):
        layer.harden(perm)
    if layers:  # a manual net is left as it was: its compiled functions stay valid
        after_hardening(model)
    return report


def _choose(model, layers, balanced, v2, permutations, time_limit):
    """`(permutations, report)` for `layers`, in order; no layer is changed."""
    matrices = [_finite_matrix(layer) for layer in layers]
    penalties = [layer.l12_penalty() for layer in layers]
    chosen, report = [], []
    try:
        for layer, matrix, penalty in zip(layers, matrices, penalties, strict=True):
            groups = 2 if v2 else (balanced.get(layer.name) if balanced else None)
            extra = {}
            if permutations is not None:
                perm = permutations[layer.name]
            elif groups:
                perm, extra = _balanced(model, layer, matrix, groups, v2, time_limit)
            else:
                perm = perm_math.nearest_permutation(matrix)
            chosen.append(perm)
            # Balanced v2 reads the earlier shuffles of a stage as hardened: this layer
            # shows its permutation to the next ones until every one is chosen.
            layer._permutation = perm
            report.append(
                {
                    "name": layer.name,
                    "channels": int(perm.size),
                    "l12_penalty": penalty,
                    "distance": perm_math.distance_to_permutation(matrix, perm),
                    "argmax_agrees": perm_math.argmax_agrees(matrix),
                    "permutation": perm.tolist(),
                    **extra,
                }
            )
    finally:
        for layer in layers:
            layer._permutation = None
    return chosen, report


def _finite_matrix(layer):
    if not layer.built:
        raise ValueError(
            f"Every shuffle must be built before hardening; nothing was hardened. "
            f"Received: unbuilt layer {layer.name!r}"
        )
    matrix = ops.convert_to_numpy(layer.matrix).astype("float64")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(
            f"The matrix of shuffle {layer.name!r} holds non-finite values (a diverged "
            "training?): it has no nearest permutation; nothing was hardened. Received: "
            f"{int(matrix.size - np.isfinite(matrix).sum())} non-finite entries of {matrix.size}"
        )
    return matrix


def _balanced(model, layer, matrix, groups, v2, time_limit):
    plain = perm_math.nearest_permutation(matrix)
    if v2:
        # Layers are chosen in network order, as the v2 blocks need.
        perm, info = nearest_balanced_v2_permutation(
            model, layer.name, matrix, time_limit=time_limit
        )
    else:
        perm, info = nearest_balanced_permutation(
            matrix, groups, time_limit=time_limit, return_info=True
        )
    return perm, {
        "groups": groups,
        "mass": info["mass"],
        "plain_mass": perm_math.matched_mass(matrix, plain),
        "plain_distance": perm_math.distance_to_permutation(matrix, plain),
        "optimal": info["optimal"],
        "seconds": info["seconds"],
    }


def check_permutations(
    model: keras.Model, permutations: dict[str, Sequence[int] | np.ndarray]
) -> dict[str, np.ndarray]:
    """`permutations` ({name: permutation}, one per relaxed shuffle of `model`) as
    {name: int64 vector}; ValueError naming the layer or entry otherwise."""
    if not isinstance(permutations, dict):
        raise ValueError(
            "`permutations` must be a dict {shuffle name: permutation}. "
            f"Received: permutations of type {type(permutations).__name__}"
        )
    sizes = {layer.name: int(layer.matrix.shape[0]) for layer in relaxed_shuffles(model)}
    if set(permutations) != set(sizes):
        raise ValueError(
            "`permutations` must name every relaxed shuffle of the model once. Received: "
            f"missing {sorted(set(sizes) - set(permutations))}, unknown "
            f"{sorted(map(str, set(permutations) - set(sizes)))}"
        )
    checked = {}
    for name, perm in permutations.items():
        checked[name] = checked_permutation(perm, f"permutations[{name!r}]")
        if checked[name].size != sizes[name]:
            raise ValueError(
                f"`permutations[{name!r}]` must have the layer's {sizes[name]} entries. "
                f"Received: {checked[name].size} entries"
            )
    return checked


def drop_removed_variables(model: keras.Model) -> None:
    """Removes variables the model no longer has (hardened matrices) from its optimizer.

    Keras optimizers have no API for it. TensorFlow and torch pass the current variables
    to `optimizer.apply`, but JAX's `fit` calls `stateless_apply`, which needs exactly the
    list the optimizer was built with (else: "optimizer was built with N variables"), and
    EMA pairs that list with its averages by position on every backend (Keras's private
    state, changed in `_keras_internals.drop_optimizer_variables`). The other variables
    keep their slots; the dropped ones' slots stay in `optimizer.variables`,
    unused, so the optimizer's saved state keeps its layout: a backup of the hardened net
    loads into a freshly built relaxed one's optimizer (`training.backup.RunBackup`).
    """
    kept = {id(v) for v in model.variables}
    _keras_internals.drop_optimizer_variables(getattr(model, "optimizer", None), kept)


def after_hardening(model: keras.Model) -> None:
    """What follows a rounding (`harden_model`, a loaded backup's hardened shuffles): the
    optimizer forgets the removed matrices and the compiled functions are reset."""
    drop_removed_variables(model)
    model.test_function = model.predict_function = None
    if getattr(model, "train_function", None) is not None:
        # Rebuild rather than clear: a running fit() keeps calling model.train_function.
        model.make_train_function(force=True)


def harden_and_evaluate(
    model: keras.Model,
    evaluate: Callable[[], tuple[float, float]] | None = None,
    balanced: bool | dict[str, int | None] = False,
    time_limit: float | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """Hardens `model` and measures the accuracy just before and just after rounding (once
    for a net with nothing to round: the two are the same net).

    Args:
        model: a built model with RelaxedShuffle layers.
        evaluate: a function of no arguments returning `(loss, accuracy)` for the
            current model, or None for no evaluation.
        balanced: as in `harden_model`.
        time_limit: as in `harden_model`.
        epoch: the completed epochs at hardening (None: the end of training).

    Returns:
        The hardening report: `epoch`, `layers` (`harden_model`'s entries) and, with
            `evaluate`, `relaxed_loss`, `relaxed_accuracy`, `rounded_loss`,
            `rounded_accuracy` and `relative_change = (rounded - relaxed) / relaxed`.
    """
    before = None if evaluate is None else evaluate()
    layers = harden_model(model, balanced=balanced, time_limit=time_limit)
    report = {"epoch": epoch, "layers": layers}
    if evaluate is not None:
        after = evaluate() if layers else before  # nothing rounded: the same net
        report.update(
            relaxed_loss=float(before[0]),
            relaxed_accuracy=float(before[1]),
            rounded_loss=float(after[0]),
            rounded_accuracy=float(after[1]),
            relative_change=(after[1] - before[1]) / before[1] if before[1] else float("nan"),
        )
    return report


def format_hardening_report(report: dict[str, Any]) -> str:
    """A few human-readable lines summarising a hardening report."""
    lines = [
        f"Hardened {len(report['layers'])} shuffles"
        + (f" after epoch {report['epoch']}" if report.get("epoch") else " at the end of training")
    ]
    if "relaxed_accuracy" in report:
        lines.append(
            f"  accuracy relaxed {report['relaxed_accuracy']:.4f} -> rounded "
            f"{report['rounded_accuracy']:.4f} (relative change {report['relative_change']:+.3e})"
        )
    for layer in report["layers"]:
        lines.append(
            f"  {layer['name']}: N={layer['channels']} P(M) {layer['l12_penalty']:.3e} "
            f"distance {layer['distance']:.3e} argmax agrees: {layer['argmax_agrees']}"
            + (
                f" balanced g={layer['groups']}: mass {layer['mass']:.3f} vs plain "
                f"{layer['plain_mass']:.3f}"
                if "groups" in layer
                else ""
            )
        )
    return "\n".join(lines)
