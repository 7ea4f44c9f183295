"""Divergence: a run whose loss or weights stop being finite is stopped before its backup.

`StopOnDivergence` (Keras's `TerminateOnNaN(raise_error=True)`, first of the run's
callbacks) checks the loss after every step, and the validation loss and the weights at
the end of an epoch, raising `TrainingDivergedError` naming the epoch and the step, so a
diverged epoch is never backed up. The divergence is recorded beside the backup
(`DIVERGENCE_FILE`): the rerun may lower its learning rate and resume from the last good
epoch.
"""

import math
import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_autoshuffle._atomic import write_json
from keras_autoshuffle.layers import attach_state
from keras_autoshuffle.training.fault_tolerance import DIVERGENCE_FILE


class TrainingDivergedError(RuntimeError):
    """The loss or the weights of a run became non-finite (NaN or infinite)."""


def non_finite(model: keras.Model, logs: dict[str, Any] | None) -> list[str]:
    """What is no longer finite: the logged losses' names and the weights' paths."""
    bad = [n for n in ("loss", "val_loss") if not math.isfinite(float((logs or {}).get(n, 0)))]
    attach_state(model)  # JAX's fit holds the values outside the variables
    for weight in model.weights:
        if keras.backend.is_float_dtype(weight.dtype):
            if not np.all(np.isfinite(keras.ops.convert_to_numpy(weight))):
                bad.append(weight.path)
    return bad


class StopOnDivergence(keras.callbacks.TerminateOnNaN):
    """`TerminateOnNaN(raise_error=True)` raising TrainingDivergedError (see the module);
    place it first among the run's callbacks.

    Args:
        backup_dir: the run's backup folder.
        learning_rates: the recipe's learning rates (recorded and quoted in the error).
    """

    def __init__(self, backup_dir: str | os.PathLike, learning_rates: Sequence[float]) -> None:
        super().__init__(raise_error=True)
        self.backup_dir = backup_dir
        self.learning_rates = [float(lr) for lr in learning_rates]
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        try:
            super().on_batch_end(batch, logs)
        except RuntimeError:  # Keras's message names the batch only
            self._stop(self.epoch, ["loss"], step=batch + 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        bad = non_finite(self.model, logs)
        if bad:
            self._stop(epoch, bad)

    def _stop(self, epoch, bad, step=None):
        """Records the divergence of (0-based) `epoch` and raises TrainingDivergedError."""
        rates = self.learning_rates
        record = {"epoch": epoch + 1, "step": step, "non_finite": bad[:10], "learning_rates": rates}
        write_json(os.path.join(self.backup_dir, DIVERGENCE_FILE), record)
        last = (
            f"the backup of epoch {epoch} in {self.backup_dir} is kept: rerun into the same "
            "output folder with a lower learning rate (--learning-rate, or get_recipe(..., "
            "learning_rate=...)) to resume from it"
            if epoch
            else "no epoch was backed up: rerun with a lower learning rate (--learning-rate, or "
            "get_recipe(..., learning_rate=...)) to start over"
        )
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        where = f" at step {step}" if step else " at its end"
        raise TrainingDivergedError(
            f"Training diverged in epoch {epoch + 1}: non-finite {shown}{where}. The run is "
            f"stopped and {last}. Received: learning_rates={rates}"
        )
