"""Fault tolerance: a run killed at any instant resumes where it stopped, and never mixes two.

Data order and augmentation are functions of (seed, epoch, example) (`data.py`), so a
resumed run ends with the weights of an uninterrupted one. What a run keeps in its
`backup/` folder until `report.json`, its last file, is written:

- `RunBackup` (Keras's `BackupAndRestore`): the weights and optimizer state after each
  epoch, written atomically (the previous backup stays until the new one is complete);
- `HardeningRecord`: a hardening's permutations and report (a hardened shuffle has no
  weights), re-applied on resume, so a run killed after its hardening does not redo it;
- `ElapsedTime`, `BestModel`: the training time and the best epoch so far;
- the run's settings, and `divergence.py`'s record of a divergence.

`prepare_run_directory` trusts none of it: before a resume every file is checked (types,
ranges, consistency with the settings and with each other) and a damaged one is named;
`RunBackup` then checks the weights file against the model. Every file is written
atomically (`_atomic`); `history.csv` keeps one row per backed-up epoch.
"""

import csv
import hashlib
import json
import math
import os
import tempfile
import time

import h5py
import keras
import numpy as np

from keras_autoshuffle import _keras_internals
from keras_autoshuffle._atomic import (
    OLD,
    as_json,
    move_into_place,
    partial_path,
    remove,
    sibling_path,
    sync,
    write_atomically,
    write_json,
)
from keras_autoshuffle.hardening.harden import check_permutations, harden_model
from keras_autoshuffle.layers import checked_permutation
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE

# Settings added after runs were already backed up, with the value those runs had:
# their backups lack the key and resume when the run asks for that value.
_SETTINGS_BEFORE_RECORDED = {"sinkhorn_iterations": 1}
# Settings a resume may change after a divergence (the advice of TrainingDivergedError).
_CHANGEABLE_AFTER_DIVERGENCE = ("learning_rates", "learning_rate")

BACKUP = "backup"
BEST_FILE = "best.json"
ELAPSED_FILE = "elapsed.json"
HARDENING_FILE = "hardening.json"
SETTINGS_FILE = "settings.json"
# Keras's BackupAndRestore files (the names its loader reads).
METADATA_FILE = "training_metadata.json"
WEIGHTS_FILE = "latest.weights.h5"
# The files of a run, report.json (written last: the run is finished) first.
RUN_FILES = (
    "report.json",
    "model.keras",
    "best.keras",
    "history.csv",
    "model.tflite",
    "saved_model",
    "logs",
)
# What the end of a run makes (after its last epoch), remade by a resumed run.
_PRODUCTS = ("model.keras", "model.tflite", "saved_model")


class RunDirectoryError(ValueError):
    """An output directory that cannot be used as asked (finished, other settings, damaged)."""


def restored_epoch(model):
    """The epochs a resumed fit skips, as `BackupAndRestore` restored them (read from
    Keras's private state in `_keras_internals.initial_epoch`)."""
    return _keras_internals.initial_epoch(model)


def _start_over(backup_dir):
    return (
        f"Delete the backup folder {backup_dir} to restart the run from scratch (its trained "
        "epochs are lost), or use another output folder."
    )


def _damaged(path, what, problem, received, remedy=None):
    folder = os.path.dirname(path)
    if remedy is None:
        remedy = _start_over(folder) if os.path.basename(folder) == BACKUP else "Delete it."
    return RunDirectoryError(
        f"The {what} file {path} is damaged: {problem}. {remedy} Received: {str(received)[:300]}"
    )


def read_json(path, what, remedy=None):
    """Reads a JSON file of a run; a damaged one raises RunDirectoryError naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise _damaged(
            path, what, "not readable JSON", f"{type(error).__name__}: {error}", remedy
        ) from None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_record(path, what, keys, remedy=None):
    """A JSON object holding at least `keys`, or RunDirectoryError naming the file."""
    record = read_json(path, what, remedy)
    if not isinstance(record, dict) or any(key not in record for key in keys):
        raise _damaged(path, what, f"not an object with {', '.join(keys)}", record, remedy)
    return record


def _epochs_of(settings):
    epochs = (settings or {}).get("epochs")
    return epochs if _is_int(epochs) and epochs > 0 else None


def _check_epoch(path, what, record, key, epochs, allow_none=False):
    value = record[key]
    if allow_none and value is None:
        return None
    high = epochs if epochs is not None else math.inf
    if not _is_int(value) or not 1 <= value <= high:
        limit = f"[1, {epochs}] (the run's epochs)" if epochs is not None else ">= 1"
        raise _damaged(path, what, f"'{key}' must be an integer in {limit}", record)
    return value


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# The backup of an epoch: weights (and optimizer state), then its metadata naming the
# weights file's SHA-256. Both are written under temporary names first; the weights move
# into place, then the metadata. Killed between the two moves, the complete metadata still
# waits under its temporary name: `_recover` finishes the move.


def save_backup(model, backup_dir, epochs):
    """Writes the backup of `epochs` completed epochs atomically (see above)."""
    os.makedirs(backup_dir, exist_ok=True)
    weights, metadata = (os.path.join(backup_dir, f) for f in (WEIGHTS_FILE, METADATA_FILE))
    weights_partial, metadata_partial = partial_path(weights), partial_path(metadata)
    remove(weights_partial)
    model.save_weights(weights_partial)
    sync(weights_partial)
    with open(metadata_partial, "w") as f:
        json.dump({"epoch": epochs, "batch": 0, "weights_sha256": sha256(weights_partial)}, f)
    sync(metadata_partial)
    move_into_place(weights_partial, weights)
    move_into_place(metadata_partial, metadata)


def _recover(backup_dir):
    """Completes or discards a backup write that a kill interrupted."""
    weights, metadata = (os.path.join(backup_dir, f) for f in (WEIGHTS_FILE, METADATA_FILE))
    weights_partial, metadata_partial = partial_path(weights), partial_path(metadata)
    if os.path.exists(metadata_partial) and not os.path.exists(weights_partial):
        # Killed between the two moves: the new weights are in place, the metadata waits.
        if not os.path.exists(weights):
            raise _damaged(metadata_partial, "backup metadata", "no weights file", weights)
        record = _read_record(metadata_partial, "backup metadata", ("weights_sha256",))
        if record["weights_sha256"] != sha256(weights):
            raise _damaged(
                metadata_partial, "backup metadata", f"not the metadata of {weights}", record
            )
        move_into_place(metadata_partial, metadata)
    remove(weights_partial)
    remove(metadata_partial)


def _trained(backup_dir):
    """Whether `backup_dir` holds a completed epoch (after `_recover`)."""
    names = (METADATA_FILE, WEIGHTS_FILE)
    return any(os.path.exists(os.path.join(backup_dir, name)) for name in names)


def backed_up_epochs(backup_dir, epochs=None):
    """Epochs completed in `backup_dir`'s backup (0 when there is none), its metadata and
    weights checked: the epoch count within [1, epochs], the weights file present and the
    one the metadata names (its SHA-256; backups of Keras's own writer carry none)."""
    path = os.path.join(backup_dir, METADATA_FILE)
    weights = os.path.join(backup_dir, WEIGHTS_FILE)
    if not os.path.exists(path):
        if os.path.exists(weights):
            raise _damaged(path, "backup metadata", "missing beside the weights file", weights)
        return 0
    record = _read_record(path, "backup metadata", ("epoch",))
    epoch = _check_epoch(path, "backup metadata", record, "epoch", epochs)
    if "batch" in record and not _is_int(record["batch"]):
        raise _damaged(path, "backup metadata", "'batch' must be an integer", record)
    if not os.path.exists(weights):
        raise _damaged(path, "backup metadata", f"its weights file {weights} is missing", record)
    digest = record.get("weights_sha256")
    if digest is not None and digest != sha256(weights):
        raise _damaged(
            weights, "backup weights", f"not the file its metadata {path} describes", digest
        )
    return epoch


def _check_settings(backup_dir, settings):
    """RunDirectoryError unless `backup_dir` records `settings` (after a divergence, the
    learning rate may differ)."""
    path = os.path.join(backup_dir, SETTINGS_FILE)
    if not os.path.exists(path):
        raise RunDirectoryError(
            f"{backup_dir} holds trained epochs but no record of the settings that made them "
            f"({SETTINGS_FILE}): resuming could mix two configurations, so it is refused. "
            f"{_start_over(backup_dir)} Received: {sorted(os.listdir(backup_dir))}"
        )
    saved = read_json(path, "run settings")
    if not isinstance(saved, dict):
        raise _damaged(path, "run settings", "not an object of settings", saved)
    for key, value in _SETTINGS_BEFORE_RECORDED.items():
        if key in settings:
            saved.setdefault(key, value)
    differ = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if differ and os.path.exists(os.path.join(backup_dir, DIVERGENCE_FILE)):
        differ = [k for k in differ if k not in _CHANGEABLE_AFTER_DIVERGENCE]
    if differ:
        raise RunDirectoryError(
            f"{os.path.dirname(backup_dir)} holds the backup of a killed run with other "
            "settings; resuming it would mix two runs. Rerun with the same settings, or use "
            f"another output directory, or delete {backup_dir}. Received: "
            + ", ".join(f"{k}={settings.get(k)!r} (backup: {saved.get(k)!r})" for k in differ)
        )


def check_hardening_record(path, record, settings=None, backed_up=None):
    """`record` (read from `path`) if it is a hardening report of this run: an `epoch`
    (None: at the end of training, then only after the last epoch's backup) equal to the
    run's `harden_at_epoch`, and `layers` naming each shuffle with a permutation."""
    what = "hardening record"
    if not isinstance(record, dict) or "epoch" not in record or "layers" not in record:
        raise _damaged(path, what, "not an object with epoch and layers", record)
    layers = record["layers"]
    if not isinstance(layers, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in layers
    ):
        raise _damaged(path, what, "'layers' must be a list of {name, permutation}", layers)
    for entry in layers:
        try:
            checked_permutation(entry.get("permutation"), f"permutation of {entry['name']}")
        except ValueError as error:
            raise _damaged(path, what, str(error).split(" Received")[0], entry) from None
    for key in ("relaxed_accuracy", "rounded_accuracy", "relaxed_loss", "rounded_loss"):
        if key in record and not _is_number(record[key]):
            raise _damaged(path, what, f"'{key}' must be a number", record[key])
    epochs = _epochs_of(settings)
    epoch = _check_epoch(path, what, record, "epoch", epochs, allow_none=True)
    if settings is not None and "harden_at_epoch" in settings:
        if epoch != settings["harden_at_epoch"]:
            raise _damaged(path, what, f"made for harden_at_epoch={epoch}, not this run's", record)
    if epoch is None and backed_up is not None and epochs is not None and backed_up < epochs:
        raise _damaged(path, what, "an end-of-training hardening before the last epoch", record)
    return record


def _check_best(backup_dir, epochs):
    path = os.path.join(backup_dir, BEST_FILE)
    if os.path.exists(path):
        record = _read_record(path, "best epoch", ("epoch", BestModel.monitor))
        _check_epoch(path, "best epoch", record, "epoch", epochs)
        value = record[BestModel.monitor]
        if not _is_number(value) or not 0 <= value <= 1:
            raise _damaged(path, "best epoch", f"'{BestModel.monitor}' must be in [0, 1]", record)


def _check_divergence(backup_dir, epochs):
    path = os.path.join(backup_dir, DIVERGENCE_FILE)
    if os.path.exists(path):
        record = _read_record(path, "divergence record", ("epoch", "learning_rates"))
        _check_epoch(path, "divergence record", record, "epoch", epochs)
        rates = record["learning_rates"]
        if not isinstance(rates, list) or not all(_is_number(r) for r in rates):
            raise _damaged(path, "divergence record", "'learning_rates' must be numbers", rates)


def check_backup(backup_dir, settings):
    """Checks every file of a killed run's backup before it is resumed with `settings`;
    returns the epochs it holds. A write a kill interrupted is completed or discarded
    first (`_recover`). The weights file is checked against the model by `RunBackup`
    when training starts."""
    _check_settings(backup_dir, settings)
    epochs = _epochs_of(settings)
    backed_up = backed_up_epochs(backup_dir, epochs)
    weights = os.path.join(backup_dir, WEIGHTS_FILE)
    try:
        with h5py.File(weights, "r"):
            pass
    except OSError as error:
        raise _damaged(weights, "backup weights", "not an HDF5 file", error) from None
    hardening = os.path.join(backup_dir, HARDENING_FILE)
    if os.path.exists(hardening):
        check_hardening_record(
            hardening, read_json(hardening, "hardening record"), settings, backed_up
        )
    elapsed_before(os.path.dirname(backup_dir))
    _check_best(backup_dir, epochs)
    _check_divergence(backup_dir, epochs)
    return backed_up


def _check_output_dir(output_dir):
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise RunDirectoryError(f"The output folder is a file. Received: output_dir={output_dir!r}")


def prepare_run_directory(output_dir, settings, overwrite=False):
    """Checks `output_dir` before a run; returns True when the run resumes a backup.

    - A backup (a killed run) resumes only with the same settings (after a divergence,
      another learning rate too); otherwise RunDirectoryError says which settings differ.
      One holding trained epochs but no settings record is refused. Every file of it is
      checked first (`check_backup`); a damaged one raises RunDirectoryError naming it.
    - A finished run (`report.json`) is never overwritten unless `overwrite=True`; then
      its files are removed first, so no stale file (an old SavedModel or LiteRT model)
      stays beside the new ones.
    - Otherwise the files of a run that died before its first backup are removed.
    - A path that is a file, or a folder that cannot be written, raises RunDirectoryError.

    Args:
        output_dir: the run's directory.
        settings: a JSON-serialisable dict of everything that defines the run.
        overwrite: replace a finished run.
    """
    output_dir = os.fspath(output_dir)
    _check_output_dir(output_dir)
    backup_dir = os.path.join(output_dir, BACKUP)
    settings = as_json(settings)
    try:
        if os.path.exists(os.path.join(output_dir, "report.json")):
            # Finished; a backup left means the kill came just before it was removed.
            remove(backup_dir)
            if not overwrite:
                raise RunDirectoryError(
                    f"{output_dir} holds a finished run (report.json); it is not overwritten. "
                    "Use another output directory, or pass overwrite=True (--overwrite) to "
                    "replace it."
                )
        elif os.path.isdir(backup_dir):
            _recover(backup_dir)
            if not _trained(backup_dir):
                if os.path.exists(os.path.join(backup_dir, SETTINGS_FILE)):
                    _check_settings(backup_dir, settings)  # killed in its first epoch
            else:
                check_backup(backup_dir, settings)
                _remove_run_files(output_dir, _PRODUCTS)
                write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
                return True
        _remove_run_files(output_dir, RUN_FILES)
        remove(backup_dir)
        write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
        return False
    except OSError as error:
        raise RunDirectoryError(
            f"The output folder cannot be used ({error.strerror or error}: "
            f"{error.filename or output_dir}). Received: output_dir={output_dir!r}"
        ) from None


def finish_run(output_dir):
    """Removes the run's backup: call after `report.json`, its last file, is written."""
    remove(os.path.join(output_dir, BACKUP))


def _remove_run_files(output_dir, names):
    """Removes run files and what a killed writer left of them (`_atomic`'s temporaries)."""
    for name in names:
        path = os.path.join(output_dir, name)
        for version in (path, partial_path(path), sibling_path(path, OLD)):
            remove(version)


def elapsed_before(output_dir):
    """Seconds a killed run trained before this invocation (0 without a backup of it)."""
    path = os.path.join(output_dir, BACKUP, ELAPSED_FILE)
    if not os.path.exists(path):
        return 0.0
    remedy = "Delete it (the run's reported time then starts from this invocation) and run again."
    saved = read_json(path, "elapsed time", remedy)
    seconds = saved.get("seconds") if isinstance(saved, dict) else None
    if not _is_number(seconds) or not 0 <= seconds < math.inf:
        raise _damaged(
            path, "elapsed time", "'seconds' must be a finite number >= 0", saved, remedy
        )
    return float(seconds)


class ElapsedTime(keras.callbacks.Callback):
    """Keeps the run's training time so far in the backup after every epoch, so that a
    killed and resumed run reports the time of all its invocations, not the last one's.

    Args:
        backup_dir: the BackupAndRestore directory.
        start: `time.time()` when this invocation began.
        before: seconds of the invocations before it (`elapsed_before`).
    """

    def __init__(self, backup_dir, start, before):
        super().__init__()
        self.path = os.path.join(backup_dir, ELAPSED_FILE)
        self.start, self.before = start, before

    def on_epoch_end(self, epoch, logs=None):
        write_json(self.path, {"seconds": self.before + time.time() - self.start})


def _h5_arrays(path):
    """{name: (shape, dtype)} of every array in an HDF5 file."""
    arrays = {}
    with h5py.File(path, "r") as f:

        def visit(name, item):
            if isinstance(item, h5py.Dataset):
                arrays[name] = (tuple(item.shape), item.dtype.str)

        f.visititems(visit)
    return arrays


def _non_finite_arrays(path):
    bad = []
    with h5py.File(path, "r") as f:

        def visit(name, item):
            if isinstance(item, h5py.Dataset) and item.dtype.kind == "f":
                if not np.all(np.isfinite(item[()])):
                    bad.append(name)

        f.visititems(visit)
    return bad


def _build_optimizer(model):
    """Builds the model's optimizer, as BackupAndRestore does before loading its state."""
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is None:
            optimizer.build(model.trainable_variables)
        else:
            with strategy.scope():
                optimizer.build(model.trainable_variables)


def check_weights_file(path, model):
    """RunDirectoryError unless the weights file `path` holds exactly the arrays `model`
    (and its optimizer) saves, of the same shapes and dtypes, all finite."""
    _build_optimizer(model)
    try:
        found = _h5_arrays(path)
    except OSError as error:
        raise _damaged(path, "backup weights", "not an HDF5 file", error) from None
    with tempfile.TemporaryDirectory() as folder:
        expected_path = os.path.join(folder, "expected.weights.h5")
        model.save_weights(expected_path)
        expected = _h5_arrays(expected_path)
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        other = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
        raise _damaged(
            path,
            "backup weights",
            f"not this model's weights ({len(missing)} arrays missing, {len(extra)} "
            f"unexpected, {len(other)} of another shape or dtype)",
            f"missing {missing[:3]}, unexpected {extra[:3]}, other "
            + str([(k, found[k], expected[k]) for k in other[:3]]),
        )
    bad = _non_finite_arrays(path)
    if bad:
        raise _damaged(path, "backup weights", "non-finite values", bad[:5])


class RunBackup(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore` whose backups are written atomically and checked.

    After each epoch the weights and optimizer state are written under temporary names
    and moved into place (`save_backup`): a kill during the write leaves the previous
    epoch's backup. The backup is kept at the end of training (`finish_run` removes it
    after the report). On resume the weights file must hold exactly the model's arrays,
    all finite, and the optimizer's step count must be the restored epochs' steps.

    Args:
        backup_dir: the run's backup folder.
    """

    def __init__(self, backup_dir):
        super().__init__(backup_dir, save_freq="epoch", delete_checkpoint=False)

    def on_train_begin(self, logs=None):
        path = os.path.join(self.backup_dir, WEIGHTS_FILE)
        if os.path.exists(path):
            check_weights_file(path, self.model)
        try:
            super().on_train_begin(logs)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise _damaged(path, "backup weights", "not loadable into the model", error) from None
        steps = (self.params or {}).get("steps")
        optimizer = self.model.optimizer
        if steps and optimizer is not None and optimizer.built:
            iterations = int(keras.ops.convert_to_numpy(optimizer.iterations))
            epoch = restored_epoch(self.model)
            # A loss-scaling optimizer skips the steps whose gradients overflowed.
            skips = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            if iterations > epoch * steps or (iterations < epoch * steps and not skips):
                raise _damaged(
                    path,
                    "backup weights",
                    f"its optimizer made {iterations} steps, not the {epoch} x {steps} of "
                    f"the {epoch} epochs its metadata counts",
                    iterations,
                )

    def on_epoch_end(self, epoch, logs=None):
        save_backup(self.model, self.backup_dir, epoch + 1)


class BestModel(keras.callbacks.Callback):
    """`best.keras`: the model of the epoch with the best `val_accuracy` so far, as
    `keras.callbacks.ModelCheckpoint(save_best_only=True)` keeps it, written atomically.
    The best so far is kept in the backup (`BEST_FILE`), so a resumed run compares with
    the epochs before the kill too.

    Args:
        path: the `.keras` file.
        backup_dir: the run's backup folder.
    """

    monitor = "val_accuracy"

    def __init__(self, path, backup_dir):
        super().__init__()
        self.path = path
        self.record_path = os.path.join(backup_dir, BEST_FILE)
        self.best = None

    def on_train_begin(self, logs=None):
        self.best = None
        if os.path.exists(self.record_path):
            self.best = _read_record(self.record_path, "best epoch", ("epoch", self.monitor))

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            return
        best = self.best
        # An epoch redone after a kill rewrites its own file.
        if best is None or value > best[self.monitor] or best["epoch"] == epoch + 1:
            write_atomically(self.path, self.model.save)
            self.best = {"epoch": epoch + 1, self.monitor: float(value)}
            write_json(self.record_path, self.best)


class HistoryLog(keras.callbacks.Callback):
    """`history.csv`: one row per epoch, `epoch` first then the logs' keys sorted (as
    `keras.callbacks.CSVLogger` writes it), rewritten atomically after each epoch. A
    resumed run keeps the rows of the epochs before the one it starts with, so each
    epoch appears once however often the run was killed.

    Args:
        path: the CSV file.
    """

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.rows = []

    def on_train_begin(self, logs=None):
        self.rows = []
        if os.path.exists(self.path):
            with open(self.path, newline="") as f:
                self.rows = [row for row in csv.DictReader(f) if _epoch_of(row) is not None]

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch, **{k: logs[k] for k in sorted(logs or {})}}
        self.rows = [r for r in self.rows if _epoch_of(r) < epoch] + [row]
        keys = sorted({k for r in self.rows for k in r if k != "epoch"})

        def write(partial):
            with open(partial, "w", newline="") as f:
                writer = csv.DictWriter(f, ["epoch", *keys], restval="NA")
                writer.writeheader()
                writer.writerows(self.rows)

        write_atomically(self.path, write)


def _epoch_of(row):
    try:
        return int(row.get("epoch"))
    except (TypeError, ValueError):
        return None


class HardeningRecord(keras.callbacks.Callback):
    """Keeps a hardening in the backup and re-applies it on resume.

    Place it after the run's `HardenShuffles` and before its backup callback in the
    callback list. At the end of the hardening epoch the report (permutations
    included) is written before the backup saves the hardened weights; on resume the
    permutations are applied to the fresh model before the backup loads weights of that
    shape. A backup older than the hardening holds relaxed weights and resumes relaxed
    (the hardening then happens again on time). A hardening at the end of training is
    recorded too: a run killed after it (during its export) applies the recorded
    permutations and report instead of rounding again.

    Args:
        backup_dir: the BackupAndRestore directory.
        hardening: the run's `HardenShuffles` callback.
    """

    def __init__(self, backup_dir, hardening):
        super().__init__()
        self.backup_dir = backup_dir
        self.hardening = hardening
        self.path = os.path.join(backup_dir, HARDENING_FILE)

    def on_train_begin(self, logs=None):
        if not os.path.exists(self.path):
            return
        backed_up = backed_up_epochs(self.backup_dir)
        report = check_hardening_record(self.path, read_json(self.path, "hardening record"))
        epochs = (self.params or {}).get("epochs")
        if report["epoch"] is None:
            if epochs is not None and backed_up >= epochs:
                self._permutations(report)
                self.hardening.recorded = report  # applied after the weights are loaded
            return
        if report["epoch"] > backed_up:
            return  # written just before a kill, ahead of its weights: harden again on time
        permutations = self._permutations(report)
        # As in the run that wrote the backup: the optimizer was built before the
        # hardening, so its saved state has slots for the relaxed matrices too.
        _build_optimizer(self.model)
        harden_model(self.model, permutations=permutations)
        self.hardening.report = report

    def _permutations(self, report):
        try:
            return check_permutations(
                self.model, {e["name"]: e["permutation"] for e in report["layers"]}
            )
        except ValueError as error:
            raise _damaged(
                self.path, "hardening record", "not this model's shuffles", error
            ) from None

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()

    def _write(self):
        report = self.hardening.report
        if report is not None and not os.path.exists(self.path):
            write_json(self.path, report)
