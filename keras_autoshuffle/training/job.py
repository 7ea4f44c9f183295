"""`TrainingJob`: what both training loops are given (`loops._fit`, Keras's `fit` on one
host; `multi_worker.custom_loop` across hosts), and the run's callbacks in their order."""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import keras

from keras_autoshuffle.callbacks import HardenShuffles, ShufflePenaltyLogger
from keras_autoshuffle.training.backup import RunBackup
from keras_autoshuffle.training.divergence import StopOnDivergence
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    ElapsedTime,
    HardeningRecord,
    HistoryLog,
)
from keras_autoshuffle.training.recipes import Recipe

# Seconds per layer for balanced hardening (then the best balanced permutation so far).
BALANCED_TIME_LIMIT = 60


@dataclasses.dataclass
class TrainingJob:
    """The training options, written once for both loops: `train()`'s, the model and
    optimizer built under the strategy's scope, the `EpochData` splits, this process's run
    folder (a worker's own under multi-worker), its `ElapsedTime`, the user's callbacks."""

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
    label_smoothing: float = 0.0
    class_weights: tuple | None = None

    def callbacks(self, hardening: HardenShuffles | None = None) -> list[keras.callbacks.Callback]:
        """The run's callbacks: the divergence check first (a diverged epoch reaches no log
        or backup), the loggers, hardening and its record, the elapsed time, the backup
        (of the hardened weights after a hardening), then the user's (each epoch backed up)."""
        backup_dir = os.path.join(self.output_dir, BACKUP)
        callbacks = [
            StopOnDivergence(backup_dir, self.recipe.learning_rates),
            ShufflePenaltyLogger(),
            keras.callbacks.TensorBoard(os.path.join(self.output_dir, "logs"), write_graph=False),
            HistoryLog(os.path.join(self.output_dir, "history.csv")),
            hardening,
            None if hardening is None else HardeningRecord(backup_dir, hardening),
            self.elapsed,
            RunBackup(backup_dir),
            *self.extra_callbacks,
        ]
        return [c for c in callbacks if c is not None]


def loop_report(
    hardening_report: dict[str, Any], evaluate: Callable[[], tuple[float, float]]
) -> dict[str, Any]:
    """The hardening's report and `final_accuracy`: the rounded net's, or for a net hardened
    before the end (trained on since), `evaluate()`'s ((loss, accuracy) on the test split)."""
    report = dict(hardening_report)
    hardened_early = report.get("epoch") is not None
    report["final_accuracy"] = evaluate()[1] if hardened_early else report.get("rounded_accuracy")
    return report
