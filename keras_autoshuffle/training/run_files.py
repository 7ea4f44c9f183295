"""The files of a run, and reading them back: a damaged one is named, never trusted.

Every record a killed run leaves is read with `read_json`, which checks its fields
(`fields`: {key: (test, what the value must be) or None}) and raises RunDirectoryError naming the
file, the problem and the remedy.
"""

import json
import math
import os
import stat

from keras_autoshuffle._validation import is_integer

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
# A run's JSON records are a few kB; a larger file is not one of them (bounds the memory).
MAX_JSON_BYTES = 64 * 2**20


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


def read_json(path, what, fields=None, remedy=None):
    """The JSON file `path` (a regular file of at most MAX_JSON_BYTES, nested as deep as
    Python's parser takes); with `fields`, an object holding each key (one ending in "?"
    may be absent) whose value passes its test. Else RunDirectoryError naming it."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block
            raise OSError(f"not a regular file: {path}")
        with open(path, "rb") as f:
            content = f.read(MAX_JSON_BYTES + 1)
        if len(content) > MAX_JSON_BYTES:
            raise ValueError(f"larger than {MAX_JSON_BYTES} bytes")
        record = json.loads(content)
    except (OSError, ValueError, RecursionError) as error:
        received = f"{type(error).__name__}: {error}"
        raise damaged(path, what, "not readable JSON", received, remedy) from None
    required = [key for key in fields or () if not key.endswith("?")]
    if fields is not None and (not isinstance(record, dict) or not set(required) <= set(record)):
        raise damaged(path, what, f"not an object with {', '.join(required)}", record, remedy)
    for key, check in (fields or {}).items():
        key = key.rstrip("?")
        if check and key in record and not check[0](record[key]):
            raise damaged(path, what, f"'{key}' must be {check[1]}", record, remedy)
    return record


def epoch_field(epochs, allow_none=False):
    """The (test, wording) of a `read_json` field holding an epoch count in [1, epochs]
    (`epochs` None: >= 1), or None with `allow_none`."""
    high = epochs if epochs is not None else math.inf
    limit = f"[1, {epochs}] (the run's epochs)" if epochs is not None else ">= 1"
    return (
        lambda v: (allow_none and v is None) or (is_integer(v) and 1 <= v <= high),
        f"an integer in {limit}",
    )


def epochs_of(settings):
    """The run's epochs from its settings, or None where they do not say."""
    epochs = (settings or {}).get("epochs")
    return epochs if is_integer(epochs) and epochs > 0 else None
