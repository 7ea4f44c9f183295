"""`TrainingJob`: what a training loop is given, and the run's callbacks in their order.

`train()` makes one after its checks; both loops take it: `loops._fit` (Keras's `fit` on
one host) and `multi_worker.custom_loop` (a hand-written step across hosts).
"""

import dataclasses
import os

import keras

from keras_autoshuffle.callbacks import ShufflePenaltyLogger
from keras_autoshuffle.training.backup import RunBackup
from keras_autoshuffle.training.divergence import StopOnDivergence
from keras_autoshuffle.training.recipes import Recipe
from keras_autoshuffle.training.records import ElapsedTime, HardeningRecord, HistoryLog
from keras_autoshuffle.training.run_files import BACKUP

# Seconds per layer for balanced hardening (then the best balanced permutation so far).
BALANCED_TIME_LIMIT = 60


@dataclasses.dataclass
class TrainingJob:
    """The training options, written once for both loops.

    Attributes:
        model, optimizer: built under the strategy's scope (the model not compiled yet).
        strategy: the `tf.distribute.Strategy`.
        train_data, test_data: `keras_autoshuffle.data.EpochData` splits.
        recipe: the `Recipe`.
        output_dir: this process's run folder (a worker's own under multi-worker).
        elapsed: the run's `ElapsedTime` (its `before` goes into the report).
        extra_callbacks: the user's callbacks, run after the built-in ones.
        jit_compile, balanced, harden_at_epoch: as `train()`'s.
        verbose: as `train()`'s (0 on a multi-worker run's non-chief workers).
        time_limit: seconds per layer for balanced hardening.
    """

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    strategy: object
    train_data: object
    test_data: object
    recipe: Recipe
    output_dir: str
    elapsed: ElapsedTime
    extra_callbacks: list = dataclasses.field(default_factory=list)
    jit_compile: bool = False
    verbose: int = 1
    balanced: bool = False
    harden_at_epoch: int | None = None
    time_limit: float | None = BALANCED_TIME_LIMIT

    @property
    def backup_dir(self):
        return os.path.join(self.output_dir, BACKUP)

    @property
    def history_path(self):
        return os.path.join(self.output_dir, "history.csv")

    def callbacks(self, hardening=None):
        """The run's callbacks in order: the divergence check first (a diverged epoch
        reaches no log or backup), logging (ShufflePenaltyLogger before the loggers),
        hardening and its record, the elapsed time, the backup, then the user's. So the
        backup of the hardening epoch holds the hardened weights, the end-of-training
        hardening is recorded before the run's files are written, and a user's callback
        sees each epoch backed up."""
        callbacks = [
            StopOnDivergence(self.backup_dir, self.recipe.learning_rates),
            ShufflePenaltyLogger(),
            keras.callbacks.TensorBoard(os.path.join(self.output_dir, "logs"), write_graph=False),
            HistoryLog(self.history_path),
            hardening,
            None if hardening is None else HardeningRecord(self.backup_dir, hardening),
            self.elapsed,
            RunBackup(self.backup_dir),
            *self.extra_callbacks,
        ]
        return [c for c in callbacks if c is not None]


def loop_report(hardening_report, evaluate):
    """What both loops report: the hardening's report and `final_accuracy`, the rounded
    net's, or for a net hardened before the end (trained on since), measured anew with
    `evaluate()` ((loss, accuracy) on the test split)."""
    report = dict(hardening_report)
    hardened_early = report.get("epoch") is not None
    report["final_accuracy"] = evaluate()[1] if hardened_early else report.get("rounded_accuracy")
    return report
