"""Fault tolerance: a run killed at any instant resumes where it stopped, and never mixes two.

Data order and augmentation are functions of (seed, epoch, example) (`data`), so a
resumed run ends with the weights of an uninterrupted one. What a run keeps in its
`backup/` folder until `report.json`, its last file, is written (each file atomically,
`_atomic`, and rewritten after every epoch):

- `RunBackup` (`backup.py`, Keras's `BackupAndRestore`): the weights and optimizer state;
  a hardened net's weights carry its permutations;
- `HardeningRecord`: a hardening's report. The backup of a hardened net carries its
  permutations, but the report is measured on the relaxed net before rounding (its
  accuracy and loss, each matrix's P(M) and distance to its permutation), and
  `HardenShuffles` needs it to know the hardening is done. A hardening at the end of
  training comes after the last epoch's backup (relaxed weights): there the recorded
  permutations are applied (`HardenShuffles.recorded`) instead of rounding again, which
  balanced hardening under a time limit could do differently. It is written before the
  backup of the hardened weights; one written ahead of its backup (killed between the
  two) is removed on resume, and the hardening happens again on time;
- `ElapsedTime`, `HistoryLog`: the training time of all invocations, one `history.csv`
  row per epoch (each epoch once however often the run was killed);
- the run's settings (`RunIdentity.record()`), and `divergence.py`'s record of a
  divergence.

`prepare_run_directory` trusts none of it: before a resume every file is checked (types,
ranges, consistency with the settings and with each other) and a damaged one is named;
`RunBackup` then checks the weights file against the model.
"""

import csv
import math
import os
import time

import keras

from keras_autoshuffle._atomic import (
    OLD,
    as_json,
    partial_path,
    remove,
    sibling_path,
    write_atomically,
    write_json,
)
from keras_autoshuffle._validation import is_integer, is_number
from keras_autoshuffle.hardening.harden import check_permutations
from keras_autoshuffle.layers import checked_permutation
from keras_autoshuffle.training.backup import backed_up_epochs, recover, saved_permutations
from keras_autoshuffle.training.identity import differences
from keras_autoshuffle.training.run_files import (
    BACKUP,
    DIVERGENCE_FILE,
    ELAPSED_FILE,
    HARDENING_FILE,
    PRODUCTS,
    RUN_FILES,
    SEARCH_DIR,
    SETTINGS_FILE,
    WEIGHTS_FILE,
    RunDirectoryError,
    damaged,
    epoch_field,
    epochs_of,
    read_json,
    start_over,
)


def elapsed_before(output_dir):
    """Seconds a killed run trained before this invocation (0 without a backup of it)."""
    path = os.path.join(output_dir, BACKUP, ELAPSED_FILE)
    if not os.path.exists(path):
        return 0.0
    remedy = "Delete it (the run's reported time then starts from this invocation) and run again."
    fields = {"seconds": (lambda s: is_number(s) and 0 <= s < math.inf, "a finite number >= 0")}
    return float(read_json(path, "elapsed time", fields, remedy)["seconds"])


class ElapsedTime(keras.callbacks.Callback):
    """Keeps the run's training time so far in the backup after every epoch.

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


class HistoryLog(keras.callbacks.Callback):
    """`history.csv` as `keras.callbacks.CSVLogger` writes it (`epoch`, then the logs'
    keys sorted), keeping on resume the rows of the epochs before the one it starts with.

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


def read_hardening_record(path, settings=None, backed_up=None):
    """The hardening report of this run at `path`: an `epoch` (None: at the end of
    training, then only after the last epoch's backup) equal to the run's
    `harden_at_epoch`, and `layers` naming each shuffle with a permutation; with
    `backed_up` epochs past its `epoch`, the permutations the backup's weights hold."""
    what, epochs = "hardening record", epochs_of(settings)
    number = (is_number, "a number")
    fields = {
        "epoch": epoch_field(epochs, allow_none=True),
        "layers": (
            lambda v: (
                isinstance(v, list)
                and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in v)
            ),
            "a list of {name, permutation}",
        ),
        **{f"{key}?": number for key in ("relaxed_accuracy", "rounded_accuracy")},
        **{f"{key}?": number for key in ("relaxed_loss", "rounded_loss")},
    }
    record = read_json(path, what, fields)
    layers, epoch = record["layers"], record["epoch"]
    for entry in layers:
        try:
            checked_permutation(entry.get("permutation"), f"permutation of {entry['name']}")
        except ValueError as error:
            raise damaged(path, what, str(error).split(" Received")[0], entry) from None
    if settings is not None and "harden_at_epoch" in settings:
        if epoch != settings["harden_at_epoch"]:
            raise damaged(path, what, f"made for harden_at_epoch={epoch}, not this run's", record)
    if epoch is None and backed_up is not None and epochs is not None and backed_up < epochs:
        raise damaged(path, what, "an end-of-training hardening before the last epoch", record)
    if epoch is not None and backed_up is not None and epoch <= backed_up:
        # The backup was saved after the hardening: its weights hold these permutations
        # (besides those of shuffles fixed from the start). Saved by position, not name.
        saved = saved_permutations(os.path.join(os.path.dirname(path), WEIGHTS_FILE))
        for entry in layers:
            if list(entry["permutation"]) not in saved:
                raise damaged(path, what, "not the hardening of the backup's weights", entry)
            saved.remove(list(entry["permutation"]))
    return record


class HardeningRecord(keras.callbacks.Callback):
    """Keeps a hardening's report in the backup (see the module). Place it after the
    run's `HardenShuffles` and before its backup callback.

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
        report = read_hardening_record(self.path, backed_up=backed_up)
        if report["epoch"] is not None:
            if report["epoch"] <= backed_up:  # the backup's weights harden the model
                self.hardening.report = report
            else:  # written ahead of its backup: the hardening runs again on time
                remove(self.path)
            return
        epochs = (self.params or {}).get("epochs")
        if epochs is not None and backed_up >= epochs:
            try:
                check_permutations(
                    self.model, {e["name"]: e["permutation"] for e in report["layers"]}
                )
            except ValueError as error:
                problem = "not this model's shuffles"
                raise damaged(self.path, "hardening record", problem, error) from None
            self.hardening.recorded = report  # applied after the weights are loaded

    def on_epoch_end(self, epoch, logs=None):
        self.on_train_end()

    def on_train_end(self, logs=None):
        report = self.hardening.report
        if report is not None and not os.path.exists(self.path):
            write_json(self.path, report)


def _check_settings(backup_dir, settings):
    """RunDirectoryError unless `backup_dir` records `settings` (a field either lacks
    takes its default; after a divergence the learning rate may differ)."""
    path = os.path.join(backup_dir, SETTINGS_FILE)
    if not os.path.exists(path):
        raise RunDirectoryError(
            f"{backup_dir} holds trained epochs but no record of the settings that made them "
            f"({SETTINGS_FILE}): resuming could mix two configurations, so it is refused. "
            f"{start_over(backup_dir)} Received: {sorted(os.listdir(backup_dir))}"
        )
    saved = read_json(path, "run settings")
    if not isinstance(saved, dict):
        raise damaged(path, "run settings", "not an object of settings", saved)
    diverged = os.path.exists(os.path.join(backup_dir, DIVERGENCE_FILE))
    differ = differences(saved, settings, diverged)
    if differ:
        raise RunDirectoryError(
            f"{os.path.dirname(backup_dir)} holds the backup of a killed run with other "
            "settings; resuming it would mix two runs. Rerun with the same settings, or use "
            f"another output directory, or delete {backup_dir}. Received: {differ}"
        )


def check_backup(backup_dir, settings):
    """Checks every file of a killed run's backup (after `recover`) before it is resumed
    with `settings`; returns the epochs it holds."""
    _check_settings(backup_dir, settings)
    epochs = epochs_of(settings)
    backed_up = backed_up_epochs(backup_dir, epochs)
    saved_permutations(os.path.join(backup_dir, WEIGHTS_FILE))  # an HDF5 file
    if os.path.exists(os.path.join(backup_dir, HARDENING_FILE)):
        read_hardening_record(os.path.join(backup_dir, HARDENING_FILE), settings, backed_up)
    elapsed_before(os.path.dirname(backup_dir))
    if os.path.exists(os.path.join(backup_dir, DIVERGENCE_FILE)):
        fields = {
            "epoch": epoch_field(epochs),
            "learning_rates": (
                lambda v: isinstance(v, list) and all(is_number(r) for r in v),
                "numbers",
            ),
            "step?": (lambda v: v is None or (is_integer(v) and v >= 1), "an integer >= 1"),
        }
        read_json(os.path.join(backup_dir, DIVERGENCE_FILE), "divergence record", fields)
    return backed_up


def prepare_run_directory(output_dir, settings, overwrite=False):
    """Checks `output_dir` before a run; returns True when the run resumes a backup.

    - A backup (a killed run) resumes only with the same settings (after a divergence,
      another learning rate too); otherwise RunDirectoryError says which settings differ.
      One holding trained epochs but no settings record is refused. Every file of it is
      checked first (`check_backup`); a damaged one raises RunDirectoryError naming it.
    - A finished run (`report.json`) is never overwritten unless `overwrite=True`; then
      its files are removed first (`clear_finished_run`).
    - Otherwise the files of a run that died before its first backup are removed, but
      for a search's `search/`, which `search.py` checks before reusing it.
    - A path that is a file, or a folder that cannot be written, raises RunDirectoryError.

    Args:
        output_dir: the run's directory.
        settings: the run's identity, `RunIdentity.record()` (or a dict of some of its
            fields: the others take their defaults).
        overwrite: replace a finished run.
    """
    output_dir = os.fspath(output_dir)
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise RunDirectoryError(f"The output folder is a file. Received: output_dir={output_dir!r}")
    backup_dir = os.path.join(output_dir, BACKUP)
    settings = as_json(settings)
    try:
        if not clear_finished_run(output_dir, overwrite) and os.path.isdir(backup_dir):
            if recover(backup_dir):
                check_backup(backup_dir, settings)
                _remove_run_files(output_dir, PRODUCTS)
                write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
                return True
            if os.path.exists(os.path.join(backup_dir, SETTINGS_FILE)):
                _check_settings(backup_dir, settings)  # killed in its first epoch
        # A search's result stays for its retraining (`search.py` checks it is this run's).
        _remove_run_files(output_dir, [name for name in RUN_FILES if name != SEARCH_DIR])
        remove(backup_dir)
        write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
        return False
    except OSError as error:
        raise _unusable(output_dir, error) from None


def _unusable(output_dir, error):
    return RunDirectoryError(
        f"The output folder cannot be used ({error.strerror or error}: "
        f"{error.filename or output_dir}). Received: output_dir={output_dir!r}"
    )


def clear_finished_run(output_dir, overwrite):
    """False where `output_dir` holds no finished run (`report.json`); else, with
    `overwrite`, removes every file of it (its `search/` too, so no stale file stays
    beside the new ones) and returns True, and without it raises RunDirectoryError."""
    output_dir = os.fspath(output_dir)
    if not os.path.exists(os.path.join(output_dir, "report.json")):
        return False
    try:
        # Finished; a backup left means the kill came just before it was removed.
        remove(os.path.join(output_dir, BACKUP))
        if not overwrite:
            raise RunDirectoryError(
                f"{output_dir} holds a finished run (report.json); it is not overwritten. "
                "Use another output directory, or pass overwrite=True (--overwrite) to "
                "replace it."
            )
        _remove_run_files(output_dir, RUN_FILES)
    except OSError as error:
        raise _unusable(output_dir, error) from None
    return True


def finish_run(output_dir):
    """Removes the run's backup: call after `report.json`, its last file, is written."""
    remove(os.path.join(output_dir, BACKUP))


def _remove_run_files(output_dir, names):
    """Removes run files and what a killed writer left of them (`_atomic`'s temporaries)."""
    for name in names:
        path = os.path.join(output_dir, name)
        for version in (path, partial_path(path), sibling_path(path, OLD)):
            remove(version)
