"""The weights backup: Keras's `BackupAndRestore`, written atomically and checked on resume.

After each epoch the weights and optimizer state, then metadata naming the weights' SHA-256,
are written under temporary names and moved into place, the weights first (killed between
the two moves, `fault_tolerance.recover` finishes). A failed write (a full disk) removes
what it left and raises RunDirectoryError, keeping the previous backup. On resume the
weights must load, be finite, and fit the optimizer's step count; a hardened shuffle's
saved permutation hardens the fresh model's shuffle as it loads.
"""

import contextlib
import errno
import json
import os
import shutil
from typing import Any

import keras
import numpy as np

from keras_autoshuffle._atomic import move_into_place, remove, sync
from keras_autoshuffle._files import sha256_of as sha256
from keras_autoshuffle._keras_internals import initial_epoch
from keras_autoshuffle.hardening.harden import after_hardening
from keras_autoshuffle.layers import relaxed_shuffles
from keras_autoshuffle.training.divergence import non_finite
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError, backup_files, damaged


def save_backup(model: keras.Model, backup_dir: str | os.PathLike, epochs: int) -> None:
    """Writes the backup of `epochs` completed epochs atomically."""
    os.makedirs(backup_dir, exist_ok=True)
    weights, metadata, weights_partial, metadata_partial = backup_files(backup_dir)
    try:
        remove(weights_partial)
        _check_space(model, backup_dir, weights)
        model.save_weights(weights_partial)
        sync(weights_partial)
        with open(metadata_partial, "w") as f:
            digest = sha256(weights_partial)
            json.dump({"epoch": epochs, "batch": 0, "weights_sha256": digest}, f)
        sync(metadata_partial)
    except OSError as error:
        remove(weights_partial)
        remove(metadata_partial)
        raise RunDirectoryError(
            f"The backup of epoch {epochs} could not be written in {backup_dir} "
            f"({os.strerror(error.errno) if error.errno else error}); its partial files were "
            "removed and the previous backup kept. Free some space (or fix the folder) and "
            f"rerun with the same arguments to resume. Received: {str(error)[:300]}"
        ) from None
    move_into_place(weights_partial, weights)
    move_into_place(metadata_partial, metadata)


def _check_space(model, backup_dir, weights):
    """OSError(ENOSPC) where the folder has less free space than the backup needs (the
    last one's size, or the variables' bytes): h5py can crash the process when a disk
    fills up while it closes a file, so a write that cannot fit is not started."""
    if os.path.exists(weights):
        needed = os.path.getsize(weights)
    else:
        variables = [*model.weights, *getattr(model.optimizer, "variables", [])]
        needed = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
    free = shutil.disk_usage(backup_dir).free
    if free < needed:
        raise OSError(
            errno.ENOSPC, f"{free} bytes free in {backup_dir}, about {needed} needed", weights
        )


class RunBackup(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore` whose backups are written atomically and checked (see
    the module). The backup is kept at the end of training (`finish_run` removes it after
    the report).

    Args:
        backup_dir: the run's backup folder.
    """

    def __init__(self, backup_dir: str | os.PathLike) -> None:
        super().__init__(backup_dir, save_freq="epoch", delete_checkpoint=False)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        path = backup_files(self.backup_dir)[0]
        relaxed = len(relaxed_shuffles(self.model))
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:  # under the strategy, not as Keras
            strategy = getattr(self.model, "distribute_strategy", None)
            with strategy.scope() if strategy else contextlib.nullcontext():
                optimizer.build(self.model.trainable_variables)
        try:
            super().on_train_begin(logs)
        except (OSError, ValueError, KeyError, TypeError) as error:
            # Keras names the first array that does not fit (missing, another shape).
            raise damaged(path, "backup weights", "not this model's weights", error) from None
        bad = non_finite(self.model, None) if os.path.exists(path) else []
        if bad:
            raise damaged(path, "backup weights", "non-finite values", bad[:5])
        if len(relaxed_shuffles(self.model)) < relaxed:
            after_hardening(self.model)
        steps = (self.params or {}).get("steps")
        if steps and optimizer is not None and optimizer.built:
            iterations = int(keras.ops.convert_to_numpy(optimizer.iterations))
            epoch = initial_epoch(self.model)
            # A loss-scaling optimizer skips the steps whose gradients overflowed.
            skips = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            if iterations > epoch * steps or (iterations < epoch * steps and not skips):
                problem = (
                    f"its optimizer made {iterations} steps, not the {epoch} x {steps} of "
                    f"the {epoch} epochs its metadata counts"
                )
                raise damaged(path, "backup weights", problem, iterations)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        save_backup(self.model, self.backup_dir, epoch + 1)
