"""Callbacks: log the l1-2 penalty, harden the learned shuffles, monitor the rounding gap."""

import warnings
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_autoshuffle import _validation, permutations
from keras_autoshuffle._keras_internals import one_pass
from keras_autoshuffle.hardening import (
    format_hardening_report,
    harden_and_evaluate,
    harden_model,
)
from keras_autoshuffle.layers import relaxed_shuffles, total_l12_penalty


def evaluate_accuracy(model: keras.Model, data: tuple | Iterable) -> tuple[float, float]:
    """(loss, accuracy) of `model` on a dataset or an `(x, y)` tuple."""
    if isinstance(data, tuple):
        results = model.evaluate(*data, verbose=0, return_dict=True)
    else:
        results = model.evaluate(**one_pass(data), verbose=0, return_dict=True)
    if not results:
        raise ValueError(
            "The validation data gave no batches: nothing to evaluate the shuffles on. "
            f"Received: data of type {type(data).__name__}"
        )
    accuracy = [v for k, v in results.items() if "acc" in k]
    if not accuracy:
        raise ValueError(
            "Evaluating relaxed vs rounded shuffles needs the model compiled with an accuracy "
            f"metric. Received metrics: {sorted(results)}"
        )
    return float(results.get("loss", float("nan"))), float(accuracy[0])


def check_validation_data(
    data: tuple | Iterable | None, name: str = "validation_data"
) -> tuple | Iterable | None:
    """`data` if `model.evaluate` can read it twice (before and after rounding).

    Accepted: None; `(x, y)` or `(x, y, sample_weight)` whose arrays (or dicts / lists of
    arrays) hold the same number of examples, at least one; a re-iterable dataset
    (`tf.data.Dataset`, `keras.utils.PyDataset`, ...) that is not known to be empty.
    """
    if data is None:
        return None
    if isinstance(data, tuple):
        if len(data) not in (2, 3):
            raise ValueError(
                f"`{name}` must be (x, y) or (x, y, sample_weight), or a dataset. "
                f"Received: a tuple of {len(data)} items"
            )
        sizes = []
        for item in data:
            for array in keras.tree.flatten(item):
                if array is not None:  # sample_weight may be None
                    shape = np.shape(array)
                    sizes.append(shape[0] if shape else None)
        if None in sizes or len(set(sizes)) != 1:
            raise ValueError(
                f"`{name}`'s x, y (and sample_weight) must be arrays with the same number of "
                f"examples. Received: first dimensions {sizes}"
            )
        if sizes[0] == 0:
            raise ValueError(f"`{name}` holds no examples. Received: first dimensions {sizes}")
        return data
    if isinstance(data, (np.ndarray, list, dict, str, bytes)) or ops.is_tensor(data):
        raise ValueError(
            f"`{name}` must be an (x, y) tuple or a dataset of (x, y) batches, not x alone or "
            f"a list. Received: {name} of type {type(data).__name__}"
        )
    iterable = hasattr(data, "__iter__") or hasattr(data, "__getitem__")
    if hasattr(data, "__next__") or not iterable:
        raise ValueError(
            f"`{name}` must be an (x, y) tuple or a re-iterable dataset (tf.data.Dataset, "
            "keras.utils.PyDataset); a generator or iterator would be used up by the first "
            f"of the two evaluations. Received: {name} of type {type(data).__name__}"
        )
    try:  # tf.data: -1 infinite, -2 unknown
        size = int(data.cardinality()) if hasattr(data, "cardinality") else len(data)
    except (TypeError, NotImplementedError):
        size = None
    if size == 0:
        raise ValueError(f"`{name}` holds no batches. Received: an empty {type(data).__name__}")
    return data


class ShufflePenaltyLogger(keras.callbacks.Callback):
    """Adds `l12_penalty` (sum_j P(M_j), without lambda) to the epoch logs.

    Put it before History, CSVLogger and TensorBoard in the callback list (Keras
    appends History itself at the end) so they record it: the decay of the
    penalty is the paper's Fig. penaltyplot.
    """

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["l12_penalty"] = total_l12_penalty(self.model)


class HardenShuffles(keras.callbacks.Callback):
    """Rounds every RelaxedShuffle to its nearest permutation at the end of training.

    With `at_epoch=k` the shuffles are hardened once `k` epochs are complete and
    training goes on with them fixed (fine-tuning the rest of the network);
    otherwise at the end of `fit`. With `validation_data` the model is evaluated
    just before and just after rounding, giving the paper's Table 3 figure
    `relative_change = (rounded - relaxed) / relaxed` of the accuracy.

    The result is kept in `self.report` (see `hardening.harden_and_evaluate`):
    `epoch`, `layers` (per layer: name, P(M), distance to the permutation, argmax
    agreement, permutation) and, with validation data, `relaxed_accuracy`,
    `rounded_accuracy`, `relative_change`, `relaxed_loss`, `rounded_loss`.

    Args:
        validation_data: a re-iterable dataset (or an `(x, y)` / `(x, y, sample_weight)`
            tuple of arrays, at least one example) for `model.evaluate`, checked here;
            the model must be compiled with an accuracy metric.
        at_epoch: harden after this many completed epochs (positive int), or None
            for the end of training. Past the last epoch of the fit it warns and
            hardens at the end.
        verbose: print the report summary.
        balanced: balanced hardening for ShuffleNet v1 / v2 (see `harden_model`).
        time_limit: seconds per layer for balanced hardening (then the best balanced
            permutation found so far); None: proven optimal, which can take minutes.

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Table 3)
    """

    def __init__(
        self,
        validation_data: tuple | Iterable | None = None,
        at_epoch: int | None = None,
        verbose: int = 1,
        balanced: bool | dict[str, int | None] = False,
        time_limit: float | None = None,
    ) -> None:
        super().__init__()
        self.at_epoch = _validation.optional_positive_int(at_epoch, "at_epoch")
        if not isinstance(balanced, (bool, dict)):
            raise ValueError(
                "`balanced` must be True, False or a dict of groups. "
                f"Received: balanced={balanced!r}"
            )
        self.time_limit = _validation.optional_positive_float(time_limit, "time_limit")
        self.validation_data = check_validation_data(validation_data)
        self.verbose = verbose
        self.balanced = balanced
        self.report = None
        # A resumed run's end-of-training hardening, applied instead of rounding anew (set
        # by `training.fault_tolerance.HardeningRecord`; its backup holds the last epoch's relaxed
        # weights): the same permutations and report. A hardening before the end needs no
        # such thing: the resumed weights carry the permutations, the record sets `report`.
        self.recorded = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        epochs = (self.params or {}).get("epochs")
        if self.at_epoch is not None and self.report is None and epochs and self.at_epoch > epochs:
            warnings.warn(
                f"HardenShuffles(at_epoch={self.at_epoch}) comes after the last epoch of this "
                f"fit (epochs={epochs}): the shuffles will be hardened at the end of training "
                "instead, with no fine-tuning after it.",
                stacklevel=2,
            )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.at_epoch is not None and epoch + 1 == self.at_epoch and self.report is None:
            self.harden(epoch + 1)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.report is None:
            self.harden(None)

    def harden(self, epoch: int | None) -> None:
        """Hardens the model now; `epoch` is recorded in the report (None: at the end).

        With `self.recorded` set (a report of this hardening from an earlier run), its
        permutations are applied and it becomes the report: nothing is recomputed."""
        data = self.validation_data
        if self.recorded is not None:
            recorded, self.recorded = self.recorded, None
            chosen = {entry["name"]: entry["permutation"] for entry in recorded["layers"]}
            harden_model(self.model, permutations=chosen)
            self.report = recorded
        else:
            self.report = harden_and_evaluate(
                self.model,
                None if data is None else (lambda: evaluate_accuracy(self.model, data)),
                balanced=self.balanced,
                time_limit=self.time_limit,
                epoch=epoch,
            )
        if self.verbose and self.report["layers"]:  # a manual net: nothing was hardened
            print(format_hardening_report(self.report))


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

    def __init__(self, validation_data: tuple | Iterable) -> None:
        super().__init__()
        if validation_data is None:
            raise ValueError(
                "RoundingMonitor needs validation data. Received: validation_data=None"
            )
        self.validation_data = check_validation_data(validation_data)

    def _accuracy(self):
        return evaluate_accuracy(self.model, self.validation_data)[1]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
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
