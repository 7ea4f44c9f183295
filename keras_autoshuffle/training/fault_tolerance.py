"""Fault tolerance: a killed run resumes where it stopped, and never mixes two runs.

Keras's `BackupAndRestore` restores weights and optimizer state at epoch granularity;
data order and augmentation are functions of (seed, epoch, example) (`data.py`), so a
resumed run ends with the weights of an uninterrupted one. Three things are added here,
on Keras's public callback API:

- `HardeningRecord` keeps a mid-training hardening (`HardenShuffles(at_epoch=k)`) in
  the backup: a hardened shuffle has no weights, its permutation lives in its config,
  so the permutations are saved next to the backup and re-applied before it is loaded.
- `prepare_run_directory` refuses to resume a backup made with other settings, and to
  overwrite a finished run, and names the damaged file when a backup cannot be read.
- `ElapsedTime` keeps the training time so far in the backup, so a resumed run reports
  the time of all its invocations.
"""

import json
import os
import time

import keras

from keras_autoshuffle.hardening.harden import drop_removed_variables

# Settings added after runs were already backed up, with the value those runs had:
# their backups lack the key and resume when the run asks for that value.
_SETTINGS_BEFORE_RECORDED = {"sinkhorn_iterations": 1}

BACKUP = "backup"
ELAPSED_FILE = "elapsed.json"
HARDENING_FILE = "hardening.json"
SETTINGS_FILE = "settings.json"
# Keras's BackupAndRestore files (its documented backup_dir layout).
METADATA_FILE = "training_metadata.json"
WEIGHTS_FILE = "latest.weights.h5"


class RunDirectoryError(ValueError):
    """An output directory that cannot be used as asked (finished, other settings, damaged)."""


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_json(path, value):
    """Writes JSON atomically: a killed process leaves the old file or the new one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2, default=_json_default)
    os.replace(path + ".tmp", path)


def read_json(path, what):
    """Reads a JSON file of a run; a damaged one raises RunDirectoryError naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise RunDirectoryError(
            f"The {what} file {path} is damaged ({type(error).__name__}: {error}). Delete it "
            "(or the whole backup folder to restart the run from scratch) and run again."
        ) from None


def backed_up_epochs(backup_dir):
    """Epochs completed in `backup_dir`'s backup (0 when there is none)."""
    path = os.path.join(backup_dir, METADATA_FILE)
    if not os.path.exists(path):
        return 0
    metadata = read_json(path, "backup metadata")
    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise RunDirectoryError(
            f"The backup metadata file {path} is damaged: no epoch count. Delete the backup "
            f"folder to restart the run from scratch. Received: {metadata!r}"
        )
    return epoch


def _check_weights_file(backup_dir):
    path = os.path.join(backup_dir, WEIGHTS_FILE)
    if not os.path.exists(path):
        return
    import h5py

    try:
        with h5py.File(path, "r"):
            pass
    except OSError as error:
        raise RunDirectoryError(
            f"The backup weights file {path} is damaged ({error}). Delete the backup folder "
            f"{backup_dir} to restart the run from scratch."
        ) from None


def prepare_run_directory(output_dir, settings, overwrite=False):
    """Checks `output_dir` before a run; returns True when the run resumes a backup.

    - A backup (a killed run) resumes only with the same settings; otherwise
      RunDirectoryError says which settings differ.
    - A finished run (`report.json`, no backup) is never overwritten unless
      `overwrite=True`; then its files are removed first, so no stale file (an old
      SavedModel or LiteRT model) stays beside the new ones.
    - Damaged backup files raise RunDirectoryError naming the file.

    Args:
        output_dir: the run's directory.
        settings: a JSON-serialisable dict of everything that defines the run.
        overwrite: replace a finished run.
    """
    backup_dir = os.path.join(output_dir, BACKUP)
    settings = json.loads(json.dumps(settings, default=_json_default))
    if os.path.isdir(backup_dir):
        settings_path = os.path.join(backup_dir, SETTINGS_FILE)
        saved = read_json(settings_path, "run settings") if os.path.exists(settings_path) else None
        if isinstance(saved, dict):
            for key, value in _SETTINGS_BEFORE_RECORDED.items():
                if key in settings:
                    saved.setdefault(key, value)
        if saved is not None and saved != settings:
            differ = sorted(
                k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k)
            )
            raise RunDirectoryError(
                f"{output_dir} holds the backup of a killed run with other settings; resuming "
                "it would mix two runs. Rerun with the same settings, or use another output "
                f"directory, or delete {backup_dir}. Received: "
                + ", ".join(f"{k}={settings.get(k)!r} (backup: {saved.get(k)!r})" for k in differ)
            )
        epochs = backed_up_epochs(backup_dir)
        _check_weights_file(backup_dir)
        if os.path.exists(os.path.join(backup_dir, HARDENING_FILE)):
            read_json(os.path.join(backup_dir, HARDENING_FILE), "hardening record")
        elapsed_before(output_dir)
        write_json(settings_path, settings)
        # A backup from before settings were recorded resumes too (its logs are appended).
        return saved is not None or epochs > 0
    if os.path.exists(os.path.join(output_dir, "report.json")):
        if not overwrite:
            raise RunDirectoryError(
                f"{output_dir} holds a finished run (report.json); it is not overwritten. Use "
                "another output directory, or pass overwrite=True (--overwrite) to replace it."
            )
        _remove_run_files(output_dir)
    write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
    return False


RUN_FILES = (
    "model.keras",
    "best.keras",
    "report.json",
    "history.csv",
    "model.tflite",
    "saved_model",
    "logs",
)


def _remove_run_files(output_dir):
    import shutil

    for name in RUN_FILES:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def elapsed_before(output_dir):
    """Seconds a killed run trained before this invocation (0 without a backup of it)."""
    path = os.path.join(output_dir, BACKUP, ELAPSED_FILE)
    if not os.path.exists(path):
        return 0.0
    saved = read_json(path, "elapsed time")
    seconds = saved.get("seconds") if isinstance(saved, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        seconds = None
    if seconds is None or not 0 <= seconds < float("inf"):
        raise RunDirectoryError(
            f"The elapsed time file {path} is damaged: 'seconds' must be a finite number >= 0. "
            f"Delete it (the run's reported time then starts from this invocation) and run "
            f"again. Received: {saved!r}"
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


class HardeningRecord(keras.callbacks.Callback):
    """Keeps a mid-training hardening in the backup and re-applies it on resume.

    Place it after the run's `HardenShuffles` and before its
    `keras.callbacks.BackupAndRestore(backup_dir)` in the callback list: at the end of
    the hardening epoch the permutations are written before the backup saves the
    hardened weights, and on resume they are applied to the fresh model before the
    backup loads weights of that shape. A backup older than the hardening holds
    relaxed weights and resumes relaxed (the hardening then happens again on time).

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
        report = read_json(self.path, "hardening record")
        if report.get("epoch") is None or report["epoch"] > backed_up_epochs(self.backup_dir):
            return  # written just before a kill, ahead of its weights: harden again on time
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            # As in the run that wrote the backup: the optimizer was built before the
            # hardening, so its saved state has slots for the relaxed matrices too.
            with self.model.distribute_strategy.scope():
                optimizer.build(self.model.trainable_variables)
        for entry in report["layers"]:
            self.model.get_layer(entry["name"]).harden(entry["permutation"])
        drop_removed_variables(self.model)  # as harden_model: JAX's fit needs it
        self.model.make_train_function(force=True)
        self.model.test_function = self.model.predict_function = None
        self.hardening.report = report

    def on_epoch_end(self, epoch, logs=None):
        report = self.hardening.report
        if report is not None and report.get("epoch") is not None and not os.path.exists(self.path):
            write_json(self.path, report)
