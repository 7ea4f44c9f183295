"""The files a fine-tuning run writes in its folder, and the rules that keep them whole: a
finished run is refused (or replaced with `overwrite`), a failed one leaves only what a
resume needs, a replaced one leaves no stale file."""

import os

from keras_autoshuffle import _atomic
from keras_autoshuffle import export as export_lib
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    METADATA_FILE,
    WEIGHTS_FILE,
    RunDirectoryError,
    full_disk_error,
)

SPLIT_FILE, LABELS_FILE, PREPROCESSING_FILE = "split.json", "labels.txt", "preprocessing.json"
HEAD_DIR, ALL_DIR, CACHE_DIR = "train_head", "train_all", "image_cache"
# The keras-hub preset of the fine-tuned classifier (`hub.presets.save_run_preset`).
PRESET_DIR = "preset"
REPORT_FILE = "report.json"
# Every file and folder a run writes (`overwrite` removes them all, nothing else).
# Where the LiteRT files are written before being moved in (a kill -9 can leave it).
LITERT_STAGING = ".litert-export"
RUN_FILES = (
    REPORT_FILE,
    LITERT_STAGING,
    "report.md",
    "confusion_matrix.png",
    PRESET_DIR,
    *export_lib.FILENAMES.values(),
    *(name for _, name in export_lib.INT8_FILES.values()),
    HEAD_DIR,
    ALL_DIR,
    CACHE_DIR,
    PREPROCESSING_FILE,
    LABELS_FILE,
    SPLIT_FILE,
)


def remove_failed_run(output_dir: str) -> None:
    """After a run in `output_dir` failed: removes its image cache, and every file of the
    run (`RUN_FILES`) where no phase holds a finished epoch (its backup) or is finished.
    What a resume needs stays."""
    try:
        _atomic.remove(os.path.join(output_dir, CACHE_DIR))
        phases = [os.path.join(output_dir, name) for name in (HEAD_DIR, ALL_DIR)]
        kept = [REPORT_FILE] + [os.path.join(BACKUP, f) for f in (METADATA_FILE, WEIGHTS_FILE)]
        if any(os.path.exists(os.path.join(p, name)) for p in phases for name in kept):
            return
        if os.path.exists(os.path.join(output_dir, REPORT_FILE)):
            return  # a finished run (refused, or replaced by nothing yet)
        clear_run(output_dir)
    except OSError:
        pass  # what cannot be removed stays (named by the error being raised)


def full_disk(error: BaseException, output_dir: str, formats: tuple[str, ...]) -> OSError | None:
    """`full_disk_error` of a failed run: its exports and its preset (`PRESET_DIR`) take
    at most `model.keras`'s size each."""
    trained = os.path.join(output_dir, ALL_DIR, "model.keras")
    try:
        needed = os.path.getsize(trained) * (2 + len(formats)) if os.path.exists(trained) else 0
    except OSError:
        needed = 0
    return full_disk_error(error, output_dir, needed)


def finished(output_dir: str, overwrite: bool) -> bool:
    """Whether `output_dir` holds a finished run (its `report.json`) to replace: refused
    without `overwrite` (`arguments.check_output` refused a file before)."""
    if not os.path.exists(os.path.join(output_dir, REPORT_FILE)):
        return False
    if not overwrite:
        raise RunDirectoryError(
            f"{output_dir} holds a finished fine-tuning (report.json); it is not overwritten. "
            "Use another output folder, or pass overwrite=True (--overwrite) to replace it."
        )
    return True


def clear_run(output_dir: str) -> None:
    """Removes every file and folder a run writes in `output_dir` (`RUN_FILES`), nothing
    else: no stale file of a replaced run stays beside the new one's."""
    for name in RUN_FILES:  # with what a killed writer left (`model.partial.tflite`)
        _atomic.remove_written(os.path.join(output_dir, name))


def finished_phases(output_dir: str, head_epochs: int) -> bool:
    """Whether every phase of the run in `output_dir` is finished (nothing to cache for)."""
    phases = [ALL_DIR] + ([HEAD_DIR] if head_epochs else [])
    return all(os.path.exists(os.path.join(output_dir, d, REPORT_FILE)) for d in phases)
