"""Fault tolerance: a run killed at any instant resumes where it stopped, and never mixes two.

Data order and augmentation are functions of (seed, epoch, example), so a resumed run
ends with the weights of an uninterrupted one. Until `report.json`, its last file, a run
keeps in `backup/`, each file rewritten atomically after every epoch: the weights and
optimizer state (`backup.RunBackup`), the settings, a divergence (`divergence.py`), the
training time (`ElapsedTime`), and a hardening's report (`HardeningRecord`), written
before the backup of the hardened weights (one ahead of its backup is removed on resume;
a hardening after the last backup applies its recorded permutations, not rounding again).
`history.csv` (`HistoryLog`) keeps one row per epoch however often the run was killed.
`prepare_run_directory` checks every file before a resume, naming a damaged one.
"""

import csv
import errno
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import h5py
import keras

from keras_autoshuffle import _atomic
from keras_autoshuffle._files import read_bounded
from keras_autoshuffle._files import sha256_of as sha256
from keras_autoshuffle._validation import is_finite_number, is_integer, is_number
from keras_autoshuffle.callbacks import HardenShuffles
from keras_autoshuffle.export import FILENAMES, INT8_FILES
from keras_autoshuffle.hardening.harden import check_permutations
from keras_autoshuffle.layers import checked_permutation
from keras_autoshuffle.training.identity import differences
from keras_autoshuffle.training.run_lock import (  # noqa: F401 (re-exported)
    LOCK_FILE,
    RunDirectoryError,
    locked_folder,
    unusable_folder,
)

BACKUP = "backup"
ELAPSED_FILE = "elapsed.json"
HARDENING_FILE = "hardening.json"
SETTINGS_FILE = "settings.json"
DIVERGENCE_FILE = "divergence.json"
# Keras's BackupAndRestore files (the names its loader reads).
METADATA_FILE = "training_metadata.json"
WEIGHTS_FILE = "latest.weights.h5"
SEARCH_DIR = "search"
# What the end of a run makes (after its last epoch), remade by a resumed run; and the
# `best.keras` an older version wrote (chosen on the test split), still removed.
PRODUCTS = (*FILENAMES.values(), *(name for _, name in INT8_FILES.values()), "best.keras")
# The files of a run, report.json (written last: the run is finished) first.
RUN_FILES = ("report.json", *PRODUCTS, "history.csv", "logs", SEARCH_DIR)
# A run's JSON records are a few kB; a larger file is not one of them (bounds the memory).
MAX_JSON_BYTES = 64 * 2**20


def start_over(backup_dir: str | os.PathLike) -> str:
    """What to do with a backup that cannot be resumed."""
    return (
        f"Delete the backup folder {backup_dir} to restart the run from scratch (its trained "
        "epochs are lost), or use another output folder."
    )


def damaged(
    path: str | os.PathLike, what: str, problem: str, received: Any, remedy: str | None = None
) -> RunDirectoryError:
    """The RunDirectoryError naming a damaged file of a run and what to do about it."""
    folder = os.path.dirname(path)
    if remedy is None:
        remedy = start_over(folder) if os.path.basename(folder) == BACKUP else "Delete it."
    return RunDirectoryError(
        f"The {what} file {path} is damaged: {problem}. {remedy} Received: {str(received)[:300]}"
    )


def read_json(
    path: str | os.PathLike,
    what: str,
    remedy: str | None = None,
    fields: Mapping[str, tuple[Callable[[Any], Any], str] | None] | None = None,
) -> Any:
    """The JSON file `path` (a regular file of at most MAX_JSON_BYTES, nested as deep as
    Python's parser takes); with `fields`, an object holding each key (one ending in "?"
    may be absent) whose value passes its test. Else RunDirectoryError naming it."""
    try:
        record = json.loads(read_bounded(path, MAX_JSON_BYTES))
    except (OSError, ValueError, RecursionError) as error:
        received = f"{type(error).__name__}: {error}"
        raise damaged(path, what, "not readable JSON", received, remedy) from None
    required = [key for key in fields or () if not key.endswith("?")]
    if fields is not None and (not isinstance(record, dict) or not set(required) <= set(record)):
        keys = f" with {', '.join(required)}" if required else ""
        raise damaged(path, what, f"not an object{keys}", record, remedy)
    for key, check in (fields or {}).items():
        key = key.rstrip("?")
        if check and key in record and not check[0](record[key]):
            raise damaged(path, what, f"'{key}' must be {check[1]}", record, remedy)
    return record


def epoch_field(epochs: int | None, allow_none: bool = False) -> tuple[Callable[[Any], bool], str]:
    """The (test, wording) of a `read_json` field holding an epoch count in [1, epochs]
    (`epochs` None: >= 1), or None with `allow_none`."""
    high = epochs if epochs is not None else math.inf
    limit = f"[1, {epochs}] (the run's epochs)" if epochs is not None else ">= 1"
    return (
        lambda v: (allow_none and v is None) or (is_integer(v) and 1 <= v <= high),
        f"an integer in {limit}",
    )


def epochs_of(settings: dict[str, Any] | None) -> int | None:
    """The run's epochs from its settings, or None where they do not say."""
    epochs = (settings or {}).get("epochs")
    return epochs if is_integer(epochs) and epochs > 0 else None


def backup_files(backup_dir: str | os.PathLike) -> tuple[str, str, str, str]:
    """(weights, metadata, their temporaries) of `backup_dir`."""
    weights, metadata = (os.path.join(backup_dir, f) for f in (WEIGHTS_FILE, METADATA_FILE))
    return weights, metadata, _atomic.sibling_path(weights), _atomic.sibling_path(metadata)


def recover(backup_dir: str | os.PathLike) -> bool:
    """Completes or discards a backup write that a kill interrupted; returns whether
    `backup_dir` then holds a completed epoch."""
    weights, metadata, weights_partial, metadata_partial = backup_files(backup_dir)
    if os.path.exists(metadata_partial) and not os.path.exists(weights_partial):
        # Killed between the two moves: the new weights are in place, the metadata waits.
        if not os.path.exists(weights):
            raise damaged(metadata_partial, "backup metadata", "no weights file", weights)
        record = read_json(metadata_partial, "backup metadata", fields={"weights_sha256": None})
        if record["weights_sha256"] != sha256(weights):
            problem = f"not the metadata of {weights}"
            raise damaged(metadata_partial, "backup metadata", problem, record)
        _atomic.move_into_place(metadata_partial, metadata)
    _atomic.remove(weights_partial)
    _atomic.remove(metadata_partial)
    return os.path.exists(metadata) or os.path.exists(weights)


def backed_up_epochs(backup_dir: str | os.PathLike, epochs: int | None = None) -> int:
    """Epochs completed in `backup_dir`'s backup (0 when there is none), its metadata and
    weights checked: the epoch count within [1, epochs], the weights file present and the
    one the metadata names (its SHA-256; backups of Keras's own writer carry none)."""
    weights, path, _, _ = backup_files(backup_dir)
    if not os.path.exists(path):
        if os.path.exists(weights):
            raise damaged(path, "backup metadata", "missing beside the weights file", weights)
        return 0
    fields = {"epoch": epoch_field(epochs), "batch?": (is_integer, "an integer")}
    record = read_json(path, "backup metadata", fields=fields)
    if not os.path.exists(weights):
        raise damaged(path, "backup metadata", f"its weights file {weights} is missing", record)
    digest = record.get("weights_sha256")
    if digest is not None and digest != sha256(weights):
        raise damaged(
            weights, "backup weights", f"not the file its metadata {path} describes", digest
        )
    return record["epoch"]


def saved_permutations(path: str | os.PathLike) -> list[list[int]]:
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


def elapsed_before(backup_dir: str | os.PathLike) -> float:
    """Seconds a killed run trained before this invocation (0 without a backup of it)."""
    path = os.path.join(backup_dir, ELAPSED_FILE)
    if not os.path.exists(path):
        return 0.0
    remedy = "Delete it (the run's reported time then starts from this invocation) and run again."
    fields = {"seconds": (lambda s: is_finite_number(s) and s >= 0, "a finite number >= 0")}
    return float(read_json(path, "elapsed time", remedy, fields)["seconds"])


class ElapsedTime(keras.callbacks.Callback):
    """Keeps the run's training time in the backup after every epoch: `before`, the
    earlier invocations' seconds (`elapsed_before`), plus this one's.

    Args:
        backup_dir: the BackupAndRestore directory.
        start: `time.time()` when this invocation began.
    """

    def __init__(self, backup_dir: str | os.PathLike, start: float) -> None:
        super().__init__()
        self.path = os.path.join(backup_dir, ELAPSED_FILE)
        self.start, self.before = start, elapsed_before(backup_dir)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        _atomic.write_json(self.path, {"seconds": self.before + time.time() - self.start})


class HistoryLog(keras.callbacks.Callback):
    """The CSV file `path` as `keras.callbacks.CSVLogger` writes it (`epoch`, then the
    logs' keys sorted), keeping on resume the rows of the epochs before the one it starts
    with."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = path

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.rows = []
        if os.path.exists(self.path):
            with open(self.path, newline="") as f:
                self.rows = [row for row in csv.DictReader(f) if _epoch_of(row) is not None]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        row = {"epoch": epoch, **{k: logs[k] for k in sorted(logs or {})}}
        self.rows = [r for r in self.rows if _epoch_of(r) < epoch] + [row]
        keys = sorted({k for r in self.rows for k in r if k != "epoch"})

        def write(partial):
            with open(partial, "w", newline="") as f:
                writer = csv.DictWriter(f, ["epoch", *keys], restval="NA")
                writer.writeheader()
                writer.writerows(self.rows)

        _atomic.write_atomically(self.path, write)


def _epoch_of(row):
    try:
        return int(row.get("epoch"))
    except (TypeError, ValueError):
        return None


def read_hardening_record(
    path: str | os.PathLike, settings: dict[str, Any] | None = None, backed_up: int | None = None
) -> dict[str, Any]:
    """The hardening report at `path` if it is this run's: its `epoch` (None: the end of
    training, then after the last backup) the run's `harden_at_epoch`, its `layers` each a
    shuffle's permutation, held by the backup's weights where it was backed up after."""
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
        **{f"{key}_{m}?": number for key in ("relaxed", "rounded") for m in ("accuracy", "loss")},
    }
    record = read_json(path, what, fields=fields)
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

    def __init__(self, backup_dir: str | os.PathLike, hardening: HardenShuffles) -> None:
        super().__init__()
        self.backup_dir = backup_dir
        self.hardening = hardening
        self.path = os.path.join(backup_dir, HARDENING_FILE)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not os.path.exists(self.path):
            return
        backed_up = backed_up_epochs(self.backup_dir)
        report = read_hardening_record(self.path, backed_up=backed_up)
        if report["epoch"] is not None:
            if report["epoch"] <= backed_up:  # the backup's weights harden the model
                self.hardening.report = report
            else:  # written ahead of its backup: the hardening runs again on time
                _atomic.remove(self.path)
            return
        epochs = (self.params or {}).get("epochs")
        if epochs is not None and backed_up >= epochs:
            permutations = {e["name"]: e["permutation"] for e in report["layers"]}
            try:
                check_permutations(self.model, permutations)
            except ValueError as error:
                problem = "not this model's shuffles"
                raise damaged(self.path, "hardening record", problem, error) from None
            self.hardening.recorded = report  # applied after the weights are loaded

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.on_train_end()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        report = self.hardening.report
        if report is not None and not os.path.exists(self.path):
            _atomic.write_json(self.path, report)


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
    saved = read_json(path, "run settings", fields={})
    differ = differences(saved, settings, os.path.exists(os.path.join(backup_dir, DIVERGENCE_FILE)))
    if differ:
        raise RunDirectoryError(
            f"{os.path.dirname(backup_dir)} holds the backup of a killed run with other "
            "settings; resuming it would mix two runs. Rerun with the same settings, or use "
            f"another output directory, or delete {backup_dir}. Received: {differ}"
        )


def check_backup(backup_dir: str | os.PathLike, settings: dict[str, Any]) -> int:
    """Checks every file of a killed run's backup (after `recover`) before it is resumed
    with `settings`; returns the epochs it holds."""
    _check_settings(backup_dir, settings)
    epochs = epochs_of(settings)
    backed_up = backed_up_epochs(backup_dir, epochs)
    saved_permutations(os.path.join(backup_dir, WEIGHTS_FILE))  # an HDF5 file
    if os.path.exists(os.path.join(backup_dir, HARDENING_FILE)):
        read_hardening_record(os.path.join(backup_dir, HARDENING_FILE), settings, backed_up)
    elapsed_before(backup_dir)
    if os.path.exists(os.path.join(backup_dir, DIVERGENCE_FILE)):
        fields = {
            "epoch": epoch_field(epochs),
            "learning_rates": (
                lambda v: isinstance(v, list) and all(is_number(r) for r in v),
                "numbers",
            ),
            "step?": (lambda v: v is None or (is_integer(v) and v >= 1), "an integer >= 1"),
        }
        read_json(os.path.join(backup_dir, DIVERGENCE_FILE), "divergence record", fields=fields)
    return backed_up


def prepare_run_directory(
    output_dir: str | os.PathLike, settings: dict[str, Any], overwrite: bool = False
) -> bool:
    """Checks `output_dir` before a run; returns True when the run resumes a backup.

    A backup resumes only with the same settings (after a divergence, another learning
    rate too) and every file of it checked (`check_backup`); a finished run is replaced
    only with `overwrite` (`clear_finished_run`); otherwise the files of a run that died
    before its first backup are removed, but for `search/` (`search.py` checks it).
    RunDirectoryError names the settings that differ, the damaged file, or the folder.

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
    settings = _atomic.as_json(settings)
    try:
        if not clear_finished_run(output_dir, overwrite) and os.path.isdir(backup_dir):
            if recover(backup_dir):
                check_backup(backup_dir, settings)
                _remove_run_files(output_dir, PRODUCTS)
                _atomic.write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
                return True
            if os.path.exists(os.path.join(backup_dir, SETTINGS_FILE)):
                _check_settings(backup_dir, settings)  # killed in its first epoch
        # A search's result stays for its retraining (`search.py` checks it is this run's).
        _remove_run_files(output_dir, [name for name in RUN_FILES if name != SEARCH_DIR])
        _atomic.remove(backup_dir)
        _atomic.write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
        return False
    except OSError as error:
        raise unusable_folder(output_dir, error) from None


def clear_finished_run(output_dir: str | os.PathLike, overwrite: bool) -> bool:
    """False where `output_dir` holds no finished run (`report.json`); else, with
    `overwrite`, removes every file of it (its `search/` too, so no stale file stays
    beside the new ones) and returns True, and without it raises RunDirectoryError."""
    output_dir = os.fspath(output_dir)
    if not os.path.exists(os.path.join(output_dir, "report.json")):
        return False
    try:
        # Finished; a backup left means the kill came just before it was removed.
        _atomic.remove(os.path.join(output_dir, BACKUP))
        if not overwrite:
            raise RunDirectoryError(
                f"{output_dir} holds a finished run (report.json); it is not overwritten. "
                "Use another output directory, or pass overwrite=True (--overwrite) to "
                "replace it."
            )
        _remove_run_files(output_dir, RUN_FILES)
    except OSError as error:
        raise unusable_folder(output_dir, error) from None
    return True


def full_disk_error(
    error: BaseException, folder: str | os.PathLike, needed: int = 0
) -> OSError | None:
    """An OSError saying that the disk of `folder` is full, where `error` says so (no
    space left), or is a writer's error naming no cause (a RuntimeError: OpenVINO's
    "basic_ios::clear: iostream error") while the disk has less than `needed` bytes
    free (what the failed writes take at most); else None."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    no_space = isinstance(error, OSError) and error.errno == errno.ENOSPC
    if not (no_space or (type(error) is RuntimeError and free < needed)):
        return None
    full = OSError(
        f"The disk of {os.fspath(folder)} is full ({free / 1e6:.2f} MB free; "
        f"{type(error).__name__}: {error}). Free some space and run the same command "
        "again: the finished epochs are kept."
    )
    full.errno = errno.ENOSPC
    return full


def finish_run(output_dir: str | os.PathLike) -> None:
    """Removes the run's backup: call after `report.json`, its last file, is written."""
    _atomic.remove(os.path.join(output_dir, BACKUP))


def _remove_run_files(output_dir, names):
    for name in names:
        _atomic.remove_written(os.path.join(output_dir, name))
