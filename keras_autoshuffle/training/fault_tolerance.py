"""Fault tolerance: a run killed at any instant resumes where it stopped, and never mixes two.

Data order and augmentation are functions of (seed, epoch, example) (`data`), so a
resumed run ends with the weights of an uninterrupted one. What a run keeps in its
`backup/` folder until `report.json`, its last file, is written:

- `RunBackup` (`backup.py`, Keras's `BackupAndRestore`): the weights and optimizer state
  after each epoch, written atomically (the previous backup stays until the new one is
  complete); a hardened net's weights carry its permutations;
- `HardeningRecord` (`records.py`): a hardening's report, measured on the relaxed net
  before rounding (and an end-of-training hardening's permutations, which come after the
  last backup), so a run killed after its hardening does not redo it;
- `ElapsedTime`, `HistoryLog` (`records.py`): the training time, one row per epoch;
- the run's settings, and `divergence.py`'s record of a divergence.

`prepare_run_directory` (here) trusts none of it: before a resume every file is checked
(types, ranges, consistency with the settings and with each other) and a damaged one is
named; `RunBackup` then checks the weights file against the model. Every file is written
atomically (`_atomic`).
"""

import os

import h5py

from keras_autoshuffle._atomic import OLD, as_json, partial_path, remove, sibling_path, write_json
from keras_autoshuffle.training.backup import backed_up_epochs, recover, trained
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE
from keras_autoshuffle.training.identity import differences
from keras_autoshuffle.training.records import check_hardening_record, elapsed_before
from keras_autoshuffle.training.run_files import (
    BACKUP,
    HARDENING_FILE,
    PRODUCTS,
    RUN_FILES,
    SEARCH_DIR,
    SETTINGS_FILE,
    WEIGHTS_FILE,
    RunDirectoryError,
    check_epoch,
    damaged,
    epochs_of,
    is_int,
    is_number,
    read_json,
    read_record,
    start_over,
)


def _check_settings(backup_dir, settings):
    """RunDirectoryError unless `backup_dir` records `settings` (a `RunIdentity` record;
    a field either lacks takes its default; after a divergence the learning rate may
    differ)."""
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


def _check_divergence(backup_dir, epochs):
    path = os.path.join(backup_dir, DIVERGENCE_FILE)
    if os.path.exists(path):
        record = read_record(path, "divergence record", ("epoch", "learning_rates"))
        check_epoch(path, "divergence record", record, "epoch", epochs)
        rates = record["learning_rates"]
        if not isinstance(rates, list) or not all(is_number(r) for r in rates):
            raise damaged(path, "divergence record", "'learning_rates' must be numbers", rates)
        step = record.get("step")
        if step is not None and not (is_int(step) and step >= 1):
            raise damaged(path, "divergence record", "'step' must be an integer >= 1", step)


def check_backup(backup_dir, settings):
    """Checks every file of a killed run's backup before it is resumed with `settings`;
    returns the epochs it holds. A write a kill interrupted is completed or discarded
    first (`recover`). The weights file is checked against the model by `RunBackup`
    when training starts."""
    _check_settings(backup_dir, settings)
    epochs = epochs_of(settings)
    backed_up = backed_up_epochs(backup_dir, epochs)
    weights = os.path.join(backup_dir, WEIGHTS_FILE)
    try:
        with h5py.File(weights, "r"):
            pass
    except OSError as error:
        raise damaged(weights, "backup weights", "not an HDF5 file", error) from None
    hardening = os.path.join(backup_dir, HARDENING_FILE)
    if os.path.exists(hardening):
        check_hardening_record(
            hardening, read_json(hardening, "hardening record"), settings, backed_up
        )
    elapsed_before(os.path.dirname(backup_dir))
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
      its files are removed first, so no stale file (an old SavedModel or LiteRT model,
      its int8 file, its search) stays beside the new ones (`clear_finished_run`).
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
    _check_output_dir(output_dir)
    backup_dir = os.path.join(output_dir, BACKUP)
    settings = as_json(settings)
    try:
        if not clear_finished_run(output_dir, overwrite) and os.path.isdir(backup_dir):
            recover(backup_dir)
            if not trained(backup_dir):
                if os.path.exists(os.path.join(backup_dir, SETTINGS_FILE)):
                    _check_settings(backup_dir, settings)  # killed in its first epoch
            else:
                check_backup(backup_dir, settings)
                _remove_run_files(output_dir, PRODUCTS)
                write_json(os.path.join(backup_dir, SETTINGS_FILE), settings)
                return True
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
    `overwrite`, removes every file of it (its `search/` too) and returns True, and
    without it raises RunDirectoryError."""
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
