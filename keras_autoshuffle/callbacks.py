"""Callbacks: log the l1-2 penalty, harden the learned shuffles, monitor the rounding gap."""

import keras
from keras import ops

from keras_autoshuffle import _validation, permutations
from keras_autoshuffle.hardening import format_hardening_report, harden_and_evaluate
from keras_autoshuffle.layers import relaxed_shuffles, total_l12_penalty


def evaluate_accuracy(model, data):
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
    """Adds `l12_penalty` (sum_j P(M_j), without lambda) to the epoch logs.

    Put it before History, CSVLogger and TensorBoard in the callback list (Keras
    appends History itself at the end) so they record it: the decay of the
    penalty is the paper's Fig. penaltyplot.
    """

    def on_epoch_end(self, epoch, logs=None):
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
        validation_data: a dataset (or `(x, y)` tuple) for `model.evaluate`; the
            model must be compiled with an accuracy metric.
        at_epoch: harden after this many completed epochs (positive int), or None
            for the end of training.
        verbose: print the report summary.
        balanced: balanced hardening for ShuffleNet v1 / v2 (see `harden_model`).
        time_limit: seconds per layer for balanced hardening (then the best balanced
            permutation found so far); None: proven optimal, which can take minutes.

    Reference:
        Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Table 3)
    """

    def __init__(
        self, validation_data=None, at_epoch=None, verbose=1, balanced=False, time_limit=None
    ):
        super().__init__()
        self.at_epoch = _validation.optional_positive_int(at_epoch, "at_epoch")
        if not isinstance(balanced, (bool, dict)):
            raise ValueError(
                "`balanced` must be True, False or a dict of groups. "
                f"Received: balanced={balanced!r}"
            )
        self.time_limit = _validation.optional_positive_float(time_limit, "time_limit")
        self.validation_data = validation_data
        self.verbose = verbose
        self.balanced = balanced
        self.report = None

    def on_epoch_end(self, epoch, logs=None):
        if self.at_epoch is not None and epoch + 1 == self.at_epoch and self.report is None:
            self.harden(epoch + 1)

    def on_train_end(self, logs=None):
        if self.report is None:
            self.harden(None)

    def harden(self, epoch):
        """Hardens the model now; `epoch` is recorded in the report (None: at the end)."""
        data = self.validation_data
        self.report = harden_and_evaluate(
            self.model,
            None if data is None else (lambda: evaluate_accuracy(self.model, data)),
            balanced=self.balanced,
            time_limit=self.time_limit,
            epoch=epoch,
        )
        if self.verbose:
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

    def __init__(self, validation_data):
        super().__init__()
        self.validation_data = validation_data

    def _accuracy(self):
        return evaluate_accuracy(self.model, self.validation_data)[1]

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
