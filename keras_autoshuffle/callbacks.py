"""Callbacks: log the shuffle penalty, and harden the learned shuffles."""

import keras
from keras import ops

from keras_autoshuffle import permutations
from keras_autoshuffle.layers import relaxed_shuffles, total_penalty


def harden_model(model, balanced=False, time_limit=None):
    """Hardens every relaxed shuffle of `model` in place; returns a per-layer report.

    Each entry holds the layer name, its penalty P(M) and its Frobenius distance to
    the chosen permutation, whether argmax rounding agrees, and the permutation. The
    model's compiled train/test/predict functions are reset, since the hardened layers
    trace to a different graph.

    Args:
        model: a model with RelaxedShuffle layers.
        balanced: False for the nearest permutation (linear assignment). True for
            balanced hardening, whose permutations fold into a graph as cheap as the
            manual one: each ShuffleNet v1 shuffle between two grouped convs gets the
            nearest permutation with the manual shuffle's g x g block counts
            (`nearest_balanced_permutation`), so that folding leaves the manual
            reshape-transpose (groups from `folding.shuffle_groups(model)`, or pass a
            dict {layer name: groups or None}); each ShuffleNet v2 shuffle gets the
            nearest permutation whose folded routing is one SPLIT and one CONCAT per
            unit (`folding.nearest_balanced_v2_permutation`, groups reported as 2).
            Entries then add `groups`, `mass` and `plain_mass` (matched mass of the
            balanced and the unconstrained nearest permutation), `plain_distance`,
            `optimal` and `seconds`.
        time_limit: seconds per layer for the balanced solver (None: prove optimality).
    """
    from keras_autoshuffle import folding

    v2 = balanced is True and folding.architecture(model) == "v2"
    if balanced is True and not v2:
        balanced = folding.shuffle_groups(model)
    elif not isinstance(balanced, (bool, dict)):
        raise ValueError(
            f"`balanced` must be True, False or a dict of groups. Received: balanced={balanced!r}"
        )
    report = []
    for layer in relaxed_shuffles(model):
        matrix = ops.convert_to_numpy(layer.matrix)
        penalty = layer.penalty_value()
        groups = 2 if v2 else (balanced.get(layer.name) if balanced else None)
        extra = {}
        if groups:
            plain = permutations.nearest_permutation(matrix)
            if v2:
                # Layers are hardened in network order, as the v2 blocks need.
                chosen, info = folding.nearest_balanced_v2_permutation(
                    model, layer.name, matrix, time_limit=time_limit
                )
            else:
                chosen, info = permutations.nearest_balanced_permutation(
                    matrix, groups, time_limit=time_limit, return_info=True
                )
            extra = {
                "groups": groups,
                "mass": info["mass"],
                "plain_mass": permutations.matched_mass(matrix, plain),
                "plain_distance": permutations.distance_to_permutation(matrix, plain),
                "optimal": info["optimal"],
                "seconds": info["seconds"],
            }
            perm = layer.harden(chosen)
        else:
            perm = layer.harden()
        report.append(
            {
                "name": layer.name,
                "channels": int(perm.size),
                "penalty": penalty,
                "distance": permutations.distance_to_permutation(matrix, perm),
                "argmax_agrees": permutations.argmax_agrees(matrix),
                "permutation": perm.tolist(),
                **extra,
            }
        )
    model.test_function = model.predict_function = None
    if getattr(model, "train_function", None) is not None:
        # Rebuild rather than clear: a running fit() keeps calling model.train_function.
        model.make_train_function(force=True)
    return report


def _evaluate(model, data):
    """(loss, accuracy) of `model` on a dataset or an `(x, y)` tuple."""
    if isinstance(data, tuple):
        results = model.evaluate(*data, verbose=0, return_dict=True)
    else:
        results = model.evaluate(data, verbose=0, return_dict=True)
    accuracy = [v for k, v in results.items() if "acc" in k]
    if not accuracy:
        raise ValueError(
            "Evaluating relaxed vs rounded shuffles needs the model compiled with an accuracy "
            f"metric. Received metrics: {sorted(results)}"
        )
    return float(results.get("loss", float("nan"))), float(accuracy[0])


class ShufflePenaltyLogger(keras.callbacks.Callback):
    """Adds `shuffle_penalty` (sum_j P(M_j), without lambda) to the epoch logs.

    Put it before History, CSVLogger and TensorBoard in the callback list (Keras
    appends History itself at the end) so they record it: the decay of the
    penalty is the paper's Fig. penaltyplot.
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["shuffle_penalty"] = total_penalty(self.model)


class HardenShuffles(keras.callbacks.Callback):
    """Rounds every RelaxedShuffle to its nearest permutation at the end of training.

    With `at_epoch=k` the shuffles are hardened once `k` epochs are complete and
    training goes on with them fixed (fine-tuning the rest of the network);
    otherwise at the end of `fit`. With `validation_data` the model is evaluated
    just before and just after rounding, giving the paper's Table 3 figure
    `relative_change = (rounded - relaxed) / relaxed` of the accuracy.

    The result is kept in `self.report`: `epoch`, `layers` (per layer: name,
    penalty, distance to the permutation, argmax agreement, permutation) and,
    with validation data, `relaxed_accuracy`, `rounded_accuracy`,
    `relative_change`, `relaxed_loss`, `rounded_loss`.

    Args:
        validation_data: a dataset (or `(x, y)` tuple) for `model.evaluate`; the
            model must be compiled with an accuracy metric.
        at_epoch: harden after this many completed epochs (positive int), or None
            for the end of training.
        verbose: print the report summary.
        balanced: balanced hardening for ShuffleNet v1 / v2 (see `harden_model`).
        time_limit: seconds per layer for balanced hardening's mixed-integer program
            (None: proven optimal, which can take minutes for wide layers).

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Table 3)
    """

    def __init__(
        self, validation_data=None, at_epoch=None, verbose=1, balanced=False, time_limit=None
    ):
        super().__init__()
        if at_epoch is not None and (
            isinstance(at_epoch, bool) or not isinstance(at_epoch, int) or at_epoch < 1
        ):
            raise ValueError(
                f"`at_epoch` must be None or a positive integer. Received: at_epoch={at_epoch}"
            )
        if not isinstance(balanced, (bool, dict)):
            raise ValueError(
                "`balanced` must be True, False or a dict of groups. "
                f"Received: balanced={balanced!r}"
            )
        number = isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool)
        if time_limit is not None and not (number and time_limit > 0):
            raise ValueError(f"`time_limit` must be positive. Received: time_limit={time_limit!r}")
        self.validation_data = validation_data
        self.at_epoch = at_epoch
        self.verbose = verbose
        self.balanced = balanced
        self.time_limit = time_limit
        self.report = None

    def on_epoch_end(self, epoch, logs=None):
        if self.at_epoch is not None and epoch + 1 == self.at_epoch and self.report is None:
            self._harden(epoch + 1)

    def on_train_end(self, logs=None):
        if self.report is None:
            self._harden(None)

    def _harden(self, epoch):
        data = self.validation_data
        before = None if data is None else _evaluate(self.model, data)
        layers = harden_model(self.model, balanced=self.balanced, time_limit=self.time_limit)
        after = None if data is None else _evaluate(self.model, data)
        report = {"epoch": epoch, "layers": layers}
        if before is not None:
            report.update(
                relaxed_loss=before[0],
                relaxed_accuracy=before[1],
                rounded_loss=after[0],
                rounded_accuracy=after[1],
                relative_change=(after[1] - before[1]) / before[1] if before[1] else float("nan"),
            )
        self.report = report
        if self.verbose:
            print(format_report(report))


def format_report(report):
    """A few human-readable lines summarising a HardenShuffles report."""
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
            f"  {layer['name']}: N={layer['channels']} penalty {layer['penalty']:.3e} "
            f"distance {layer['distance']:.3e} argmax agrees: {layer['argmax_agrees']}"
            + (
                f" balanced g={layer['groups']}: mass {layer['mass']:.3f} vs plain "
                f"{layer['plain_mass']:.3f}"
                if "groups" in layer
                else ""
            )
        )
    return "\n".join(lines)


class RoundingMonitor(keras.callbacks.Callback):
    """Logs the validation accuracy of the relaxed and of the rounded network each epoch.

    The rounded network is evaluated by temporarily setting every relaxed matrix to
    its nearest permutation matrix (the same outputs as a hardened gather), then
    restoring it, so training is unaffected. Adds `val_relaxed_accuracy` and
    `val_rounded_accuracy` to the epoch logs: the paper's Fig. roundplot.

    Args:
        validation_data: a dataset (or `(x, y)` tuple) for `model.evaluate`; the
            model must be compiled with an accuracy metric.
    """

    def __init__(self, validation_data):
        super().__init__()
        self.validation_data = validation_data

    def _accuracy(self):
        return _evaluate(self.model, self.validation_data)[1]

    def on_epoch_end(self, epoch, logs=None):
        shuffles = relaxed_shuffles(self.model)
        relaxed = self._accuracy()
        saved = [ops.convert_to_numpy(layer.matrix) for layer in shuffles]
        try:
            for layer, matrix in zip(shuffles, saved, strict=True):
                perm = permutations.nearest_permutation(matrix)
                layer.matrix.assign(permutations.permutation_matrix(perm))
            rounded = self._accuracy()
        finally:
            for layer, matrix in zip(shuffles, saved, strict=True):
                layer.matrix.assign(matrix)
        if logs is not None:
            logs["val_relaxed_accuracy"] = relaxed
            logs["val_rounded_accuracy"] = rounded
