"""Divergence: a run whose loss or weights stop being finite is stopped before its backup.

As `keras.callbacks.TerminateOnNaN`, but the run raises instead of ending normally (which
would harden, export and report a broken network, and replace the last good backup):
`StopOnDivergence` runs first at the end of each epoch, so the epoch that diverged is never
backed up, and the run resumes from the last good one, e.g. with a lower learning rate
(`fault_tolerance.prepare_run_directory` accepts that one change after a divergence).
"""

import math
import os

import keras
import numpy as np

from keras_autoshuffle._atomic import write_json
from keras_autoshuffle.layers import attach_state

DIVERGENCE_FILE = "divergence.json"


class TrainingDivergedError(RuntimeError):
    """The loss or the weights of a run became non-finite (NaN or infinite)."""


def non_finite(model, logs):
    """What is no longer finite: the logged losses' names and the weights' paths."""
    bad = [
        name
        for name in ("loss", "val_loss")
        if name in (logs or {}) and not math.isfinite(float(logs[name]))
    ]
    attach_state(model)  # JAX's fit holds the values outside the variables
    for weight in model.weights:
        if keras.backend.is_float_dtype(weight.dtype):
            if not np.all(np.isfinite(keras.ops.convert_to_numpy(weight))):
                bad.append(weight.path)
    return bad


class StopOnDivergence(keras.callbacks.Callback):
    """Raises TrainingDivergedError at the end of an epoch whose loss or weights are not
    finite, before any later callback (logs, checkpoints, hardening, backup) sees it.

    The divergence is recorded in `backup_dir` (`DIVERGENCE_FILE`: the epoch, what went
    non-finite, the learning rates), which lets the resumed run change its learning rate.

    Args:
        backup_dir: the run's backup folder.
        learning_rates: the recipe's learning rates (recorded and quoted in the error).
    """

    def __init__(self, backup_dir, learning_rates):
        super().__init__()
        self.backup_dir = backup_dir
        self.learning_rates = [float(lr) for lr in learning_rates]

    def on_epoch_end(self, epoch, logs=None):
        bad = non_finite(self.model, logs)
        if not bad:
            return
        write_json(
            os.path.join(self.backup_dir, DIVERGENCE_FILE),
            {"epoch": epoch + 1, "non_finite": bad[:10], "learning_rates": self.learning_rates},
        )
        last = (
            f"the backup of epoch {epoch} in {self.backup_dir} is kept: rerun into the same "
            "output folder with a lower learning rate (--learning-rate, or get_recipe(..., "
            "learning_rate=...)) to resume from it"
            if epoch
            else "no epoch was backed up: rerun with a lower learning rate (--learning-rate, or "
            "get_recipe(..., learning_rate=...)) to start over"
        )
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise TrainingDivergedError(
            f"Training diverged in epoch {epoch + 1}: non-finite {shown}. The run is stopped "
            f"and {last}. Received: learning_rates={self.learning_rates}"
        )
