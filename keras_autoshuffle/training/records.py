"""The run's records beside its weights backup: training time, `history.csv`, the hardening.

Each is a callback that rewrites its file atomically after every epoch and reads it back
on resume, so a run killed and rerun reports as an uninterrupted one.
"""

import csv
import math
import os
import time

import keras

from keras_autoshuffle._atomic import remove, write_atomically, write_json
from keras_autoshuffle.hardening.harden import check_permutations
from keras_autoshuffle.layers import checked_permutation
from keras_autoshuffle.training.backup import backed_up_epochs, saved_permutations
from keras_autoshuffle.training.run_files import (
    BACKUP,
    ELAPSED_FILE,
    HARDENING_FILE,
    WEIGHTS_FILE,
    check_epoch,
    damaged,
    epochs_of,
    is_number,
    read_json,
)


def elapsed_before(output_dir):
    """Seconds a killed run trained before this invocation (0 without a backup of it)."""
    path = os.path.join(output_dir, BACKUP, ELAPSED_FILE)
    if not os.path.exists(path):
        return 0.0
    remedy = "Delete it (the run's reported time then starts from this invocation) and run again."
    saved = read_json(path, "elapsed time", remedy)
    seconds = saved.get("seconds") if isinstance(saved, dict) else None
    if not is_number(seconds) or not 0 <= seconds < math.inf:
        raise damaged(path, "elapsed time", "'seconds' must be a finite number >= 0", saved, remedy)
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


def check_hardening_record(path, record, settings=None, backed_up=None):
    """`record` (read from `path`) if it is a hardening report of this run: an `epoch`
    (None: at the end of training, then only after the last epoch's backup) equal to the
    run's `harden_at_epoch`, and `layers` naming each shuffle with a permutation; with
    `backed_up` epochs past its `epoch`, the permutations the backup's weights hold."""
    what = "hardening record"
    if not isinstance(record, dict) or "epoch" not in record or "layers" not in record:
        raise damaged(path, what, "not an object with epoch and layers", record)
    layers = record["layers"]
    if not isinstance(layers, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in layers
    ):
        raise damaged(path, what, "'layers' must be a list of {name, permutation}", layers)
    for entry in layers:
        try:
            checked_permutation(entry.get("permutation"), f"permutation of {entry['name']}")
        except ValueError as error:
            raise damaged(path, what, str(error).split(" Received")[0], entry) from None
    for key in ("relaxed_accuracy", "rounded_accuracy", "relaxed_loss", "rounded_loss"):
        if key in record and not is_number(record[key]):
            raise damaged(path, what, f"'{key}' must be a number", record[key])
    epochs = epochs_of(settings)
    epoch = check_epoch(path, what, record, "epoch", epochs, allow_none=True)
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
    """Keeps a hardening's report in the backup, for the report of a resumed run.

    Still needed although the backup of a hardened net carries its permutations
    (`RelaxedShuffle.save_own_variables`, loaded by `RunBackup`): the report is measured
    on the relaxed net, which the hardened weights no longer hold (the accuracy and loss
    just before rounding, each matrix's P(M) and distance to its permutation: the
    report's `relaxed_accuracy`, `relative_change`, `layers`, `l12_penalty_at_hardening`),
    and `HardenShuffles` needs it to know the hardening is done. A hardening at the end of
    training comes after the last epoch's backup (relaxed weights): there the recorded
    permutations are applied (`HardenShuffles.recorded`) instead of rounding again, which
    balanced hardening under a time limit could do differently.

    Place it after the run's `HardenShuffles` and before its backup callback in the
    callback list: the report is written before the backup of the hardened weights. A
    record written ahead of its backup (killed between the two) is removed on resume: the
    backup holds relaxed weights, and the hardening happens again on time.

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
        record = read_json(self.path, "hardening record")
        report = check_hardening_record(self.path, record, backed_up=backed_up)
        if report["epoch"] is not None:
            if report["epoch"] <= backed_up:  # the backup's weights harden the model
                self.hardening.report = report
            else:
                # Written ahead of its backup (killed between the two): the hardening runs
                # again on time and writes its own record, which a later resume checks.
                remove(self.path)
            return
        epochs = (self.params or {}).get("epochs")
        if epochs is not None and backed_up >= epochs:
            try:
                check_permutations(
                    self.model, {e["name"]: e["permutation"] for e in report["layers"]}
                )
            except ValueError as error:
                raise damaged(
                    self.path, "hardening record", "not this model's shuffles", error
                ) from None
            self.hardening.recorded = report  # applied after the weights are loaded

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()

    def _write(self):
        report = self.hardening.report
        if report is not None and not os.path.exists(self.path):
            write_json(self.path, report)
