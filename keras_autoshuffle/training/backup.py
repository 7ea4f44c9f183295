"""The weights backup: Keras's `BackupAndRestore`, written atomically and checked on resume.

The backup of an epoch: weights and optimizer state, then its metadata naming the weights
file's SHA-256, both written under temporary names first (`_atomic`); the weights move
into place, then the metadata. Killed between the two moves, the complete metadata still
waits under its temporary name: `recover` finishes the move. A write that fails (a full
disk) removes what it left and raises RunDirectoryError; the previous backup stays.

On resume (`RunBackup.on_train_begin`) the weights must load into the model (Keras's
`load_weights` refuses missing arrays and other shapes), all finite, and the optimizer's
step count must be the restored epochs' steps. A hardened shuffle writes its permutation
where a relaxed one writes its matrix (`RelaxedShuffle.save_own_variables`), so the backup
of a hardened net hardens the fresh (relaxed) model's shuffles as it loads; the optimizer
was built before, on the relaxed variables, as in the run that saved it, so its state fits.
"""

import contextlib
import errno
import json
import os
import shutil

import h5py
import keras
import numpy as np

from keras_autoshuffle._atomic import move_into_place, partial_path, remove, sync
from keras_autoshuffle._files import sha256_of as sha256
from keras_autoshuffle._keras_internals import initial_epoch
from keras_autoshuffle._validation import is_integer
from keras_autoshuffle.hardening.harden import drop_removed_variables
from keras_autoshuffle.layers import relaxed_shuffles
from keras_autoshuffle.training.divergence import non_finite
from keras_autoshuffle.training.run_files import (
    METADATA_FILE,
    WEIGHTS_FILE,
    RunDirectoryError,
    damaged,
    epoch_field,
    read_json,
)


def _paths(backup_dir):
    """(weights, metadata, their temporaries) of `backup_dir`."""
    weights, metadata = (os.path.join(backup_dir, f) for f in (WEIGHTS_FILE, METADATA_FILE))
    return weights, metadata, partial_path(weights), partial_path(metadata)


def save_backup(model, backup_dir, epochs):
    """Writes the backup of `epochs` completed epochs atomically."""
    os.makedirs(backup_dir, exist_ok=True)
    weights, metadata, weights_partial, metadata_partial = _paths(backup_dir)
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


def recover(backup_dir):
    """Completes or discards a backup write that a kill interrupted; returns whether
    `backup_dir` then holds a completed epoch."""
    weights, metadata, weights_partial, metadata_partial = _paths(backup_dir)
    if os.path.exists(metadata_partial) and not os.path.exists(weights_partial):
        # Killed between the two moves: the new weights are in place, the metadata waits.
        if not os.path.exists(weights):
            raise damaged(metadata_partial, "backup metadata", "no weights file", weights)
        record = read_json(metadata_partial, "backup metadata", {"weights_sha256": None})
        if record["weights_sha256"] != sha256(weights):
            problem = f"not the metadata of {weights}"
            raise damaged(metadata_partial, "backup metadata", problem, record)
        move_into_place(metadata_partial, metadata)
    remove(weights_partial)
    remove(metadata_partial)
    return os.path.exists(metadata) or os.path.exists(weights)


def backed_up_epochs(backup_dir, epochs=None):
    """Epochs completed in `backup_dir`'s backup (0 when there is none), its metadata and
    weights checked: the epoch count within [1, epochs], the weights file present and the
    one the metadata names (its SHA-256; backups of Keras's own writer carry none)."""
    weights, path, _, _ = _paths(backup_dir)
    if not os.path.exists(path):
        if os.path.exists(weights):
            raise damaged(path, "backup metadata", "missing beside the weights file", weights)
        return 0
    fields = {"epoch": epoch_field(epochs), "batch?": (is_integer, "an integer")}
    record = read_json(path, "backup metadata", fields)
    if not os.path.exists(weights):
        raise damaged(path, "backup metadata", f"its weights file {weights} is missing", record)
    digest = record.get("weights_sha256")
    if digest is not None and digest != sha256(weights):
        raise damaged(
            weights, "backup weights", f"not the file its metadata {path} describes", digest
        )
    return record["epoch"]


def saved_permutations(path):
    """The permutations of the hardened shuffles a weights file holds (sorted lists)."""
    found = []

    def visit(name, item):  # a hardened RelaxedShuffle's entry in place of its matrix
        if isinstance(item, h5py.Dataset) and name.endswith("/vars/permutation"):
            found.append(item[()].tolist())

    try:
        with h5py.File(path, "r") as f:
            f.visititems(visit)
    except OSError as error:
        raise damaged(path, "backup weights", "not an HDF5 file", error) from None
    return sorted(found)


class RunBackup(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore` whose backups are written atomically and checked (see
    the module). The backup is kept at the end of training (`finish_run` removes it after
    the report).

    Args:
        backup_dir: the run's backup folder.
    """

    def __init__(self, backup_dir):
        super().__init__(backup_dir, save_freq="epoch", delete_checkpoint=False)

    def on_train_begin(self, logs=None):
        path = os.path.join(self.backup_dir, WEIGHTS_FILE)
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
            _after_hardening_load(self.model)
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

    def on_epoch_end(self, epoch, logs=None):
        save_backup(self.model, self.backup_dir, epoch + 1)


def _after_hardening_load(model):
    """What `harden_model` does after rounding, for shuffles a loaded backup hardened:
    the optimizer forgets their matrices (whose slots stay, as in the run that saved the
    backup) and the compiled functions are rebuilt for the hardened graph."""
    drop_removed_variables(model)
    model.test_function = model.predict_function = None
    if getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)
