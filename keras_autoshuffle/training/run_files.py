"""The files of a run, and reading them back: a damaged one is named, never trusted.

Every record a killed run leaves is checked before a resume (`fault_tolerance`): `read_json`
and `read_record` raise RunDirectoryError naming the file, the problem and the remedy.
"""

import json
import math
import os
import stat

BACKUP = "backup"
ELAPSED_FILE = "elapsed.json"
HARDENING_FILE = "hardening.json"
SETTINGS_FILE = "settings.json"
# Keras's BackupAndRestore files (the names its loader reads).
METADATA_FILE = "training_metadata.json"
WEIGHTS_FILE = "latest.weights.h5"
SEARCH_DIR = "search"
# What the end of a run makes (after its last epoch), remade by a resumed run; and the
# `best.keras` an older version wrote (chosen on the test split), still removed.
PRODUCTS = (
    "model.keras",
    "model.tflite",
    "model_int8.tflite",
    "saved_model",
    "model.onnx",
    "openvino",
    "best.keras",
)
# The files of a run, report.json (written last: the run is finished) first.
RUN_FILES = ("report.json", *PRODUCTS, "history.csv", "logs", SEARCH_DIR)


class RunDirectoryError(ValueError):
    """An output directory that cannot be used as asked (finished, other settings, damaged)."""


def start_over(backup_dir):
    return (
        f"Delete the backup folder {backup_dir} to restart the run from scratch (its trained "
        "epochs are lost), or use another output folder."
    )


def damaged(path, what, problem, received, remedy=None):
    """The RunDirectoryError naming a damaged file of a run and what to do about it."""
    folder = os.path.dirname(path)
    if remedy is None:
        remedy = start_over(folder) if os.path.basename(folder) == BACKUP else "Delete it."
    return RunDirectoryError(
        f"The {what} file {path} is damaged: {problem}. {remedy} Received: {str(received)[:300]}"
    )


# A run's JSON records are a few kB; a larger file is not one of them (bounds the memory).
MAX_JSON_BYTES = 64 * 2**20


def read_json(path, what, remedy=None):
    """Reads a JSON file of a run; a damaged one raises RunDirectoryError naming it.

    Regular files only (a FIFO would block), at most MAX_JSON_BYTES, nesting as deep as
    Python's parser takes (deeper is damaged, not a RecursionError)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise OSError(f"not a regular file: {path}")
        with open(path, "rb") as f:
            content = f.read(MAX_JSON_BYTES + 1)
        if len(content) > MAX_JSON_BYTES:
            raise ValueError(f"larger than {MAX_JSON_BYTES} bytes")
        return json.loads(content)
    except (OSError, ValueError, RecursionError) as error:
        raise damaged(
            path, what, "not readable JSON", f"{type(error).__name__}: {error}", remedy
        ) from None


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_record(path, what, keys, remedy=None):
    """A JSON object holding at least `keys`, or RunDirectoryError naming the file."""
    record = read_json(path, what, remedy)
    if not isinstance(record, dict) or any(key not in record for key in keys):
        raise damaged(path, what, f"not an object with {', '.join(keys)}", record, remedy)
    return record


def epochs_of(settings):
    """The run's epochs from its settings, or None where they do not say."""
    epochs = (settings or {}).get("epochs")
    return epochs if is_int(epochs) and epochs > 0 else None


def check_epoch(path, what, record, key, epochs, allow_none=False):
    """`record[key]`, an epoch count in [1, epochs] (None allowed with `allow_none`)."""
    value = record[key]
    if allow_none and value is None:
        return None
    high = epochs if epochs is not None else math.inf
    if not is_int(value) or not 1 <= value <= high:
        limit = f"[1, {epochs}] (the run's epochs)" if epochs is not None else ">= 1"
        raise damaged(path, what, f"'{key}' must be an integer in {limit}", record)
    return value
