"""Running the experiments' trainings: one run per spec, resumable, in parallel processes.

Each run trains with `training.train` into its own directory and keeps its result row in
`result.json`; a rerun reads finished rows back and resumes a killed training from its
backup. Shared by the small-scale reproduction (`paper.py`) and the Fashion-MNIST
study (`study.py`).
"""

import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os

import keras
import numpy as np

from keras_autoshuffle import _validation, data, hardening, training
from keras_autoshuffle._atomic import write_json
from keras_autoshuffle.callbacks import RoundingMonitor
from keras_autoshuffle.layers import relaxed_shuffles, shuffle_layers
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError, read_json


def check_settings(settings):
    """The checks every experiment's settings need: lambda = 0 and the recommended lambda
    among those swept (the reports compare them), hardening before the last epoch."""
    _validation.positive_int(settings.epochs, "epochs")
    _validation.choice(settings.padding, ("torch", "same"), "padding")
    _validation.optional_positive_int(settings.max_train_examples, "max_train_examples")
    for x in settings.lambdas:
        _validation.penalty(x, "lambdas")
    _validation.penalty(settings.penalty)
    if 0.0 not in settings.lambdas:
        raise ValueError(
            "`lambdas` must include 0 (the sweep's baseline, no penalty). "
            f"Received: lambdas={settings.lambdas}"
        )
    if settings.penalty not in settings.lambdas:
        raise ValueError(
            "`penalty` must be one of the swept `lambdas` (the reports compare it with the "
            f"others): add it to them. Received: lambdas={settings.lambdas}, "
            f"penalty={settings.penalty}"
        )
    if not 1 <= settings.harden_at_epoch < settings.epochs:
        raise ValueError(
            f"`harden_at_epoch` must be in [1, epochs - 1] (epochs={settings.epochs}). "
            f"Received: harden_at_epoch={settings.harden_at_epoch}"
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training of a reproduction: its directory name and what defines it."""

    name: str
    model: str
    shuffle: str
    penalty: float
    seed: int = 0
    harden_at_epoch: int | None = None
    # Constraint passes per step of the learned shuffles; 1 = the paper's Algorithm 1,
    # what the reproductions reproduce (the builders' default is 10).
    sinkhorn_iterations: int = 1
    # The study's arms (docs/fashion_mnist): where a learned shuffle starts, what it
    # computes while training, and search-then-retrain (`search_epochs`, `balanced`).
    shuffle_initializer: str = "random"
    shuffle_forward: str = "relaxed"
    search_epochs: int | None = None
    balanced: bool = False
    arm: str | None = None


class _Snapshot(keras.callbacks.Callback):
    """Keeps each epoch's logs (the rounding monitor's included) and the last relaxed
    matrices on disk, so that a killed and resumed run loses nothing."""

    def __init__(self, output_dir):
        super().__init__()
        self.history_path = os.path.join(output_dir, "epochs.json")
        self.matrices_path = os.path.join(output_dir, "relaxed.npz")

    def on_epoch_end(self, epoch, logs=None):
        history = _read_json(self.history_path) or {}
        history[str(epoch)] = {k: float(v) for k, v in (logs or {}).items()}
        write_json(self.history_path, history)
        matrices = [keras.ops.convert_to_numpy(s.matrix) for s in relaxed_shuffles(self.model)]
        if matrices:
            np.savez(self.matrices_path + ".tmp.npz", *matrices)
            os.replace(self.matrices_path + ".tmp.npz", self.matrices_path)


def _read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def recipe_name(dataset):
    """The training recipe a reproduction on `dataset` starts from (then overridden)."""
    return dataset if dataset in training.RECIPES else "cifar10"


def run_one(settings, splits, spec, output_dir):
    """Trains one run of `spec` (resuming a killed one) and returns its result row.

    A finished run's row is kept in `output_dir/result.json` and read back instead of
    training again; the row is built from the run's files (report, saved model, epoch
    logs), so a run killed after training and before its row was written loses nothing.

    Args:
        settings: `Settings` (or the study's): data set, epochs, batch, lr, widths.
        splits: `(train_data, test_data)`.
        spec: a `RunSpec`.
        output_dir: the run's directory.
    """
    result_path = os.path.join(output_dir, "result.json")
    if os.path.exists(result_path):
        row = check_row(result_path, read_json(result_path, "result row", _REBUILD), spec, settings)
    else:
        if not os.path.exists(os.path.join(output_dir, "report.json")):
            _train(settings, splits, spec, output_dir)
        row = _row_from_files(settings, splits[1], spec, output_dir)
        write_json(result_path, row)
    return _with_arrays(row, output_dir)


_REBUILD = (
    "Delete it: a rerun rebuilds it from the run's files, or trains the run again where "
    "they are gone."
)


def _fraction(value):
    return _number(value) and 0 <= value <= 1


def _number(value):
    """A finite int or float (not a bool) that fits a float: JSON's integers may have
    hundreds of digits (`np.isfinite(10**400)` raises TypeError; it is refused here)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def _count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _logged(values):
    return isinstance(values, list) and all(isinstance(x, float) or _number(x) for x in values)


def _shown(value, limit=200):
    """`repr(value)`, cut to `limit` characters (a row may hold a 400-digit integer or a
    megabyte of text; Python refuses to write an int of more than 4300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an int of {len(format(value, 'x'))} hex digits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A row's entries and what each must be (rows from before the arms lack the optional ones).
_ROW_ENTRIES = {
    "name": lambda v: isinstance(v, str),
    "model": lambda v: v in ("v1", "v2"),
    "shuffle": lambda v: v in ("manual", "auto"),
    "lambda": lambda v: _number(v) and v >= 0,
    "seed": _count,
    "epochs": lambda v: _count(v) and v > 0,
    "harden_at_epoch": lambda v: v is None or (_count(v) and v > 0),
    "relaxed_accuracy": _fraction,
    "rounded_accuracy": _fraction,
    "final_accuracy": _fraction,
    "relative_change": lambda v: v is None or _number(v),
    "penalty": lambda v: _number(v) and v >= 0,
    "routing_difference": lambda v: _number(v) and v >= 0,
    "seconds": lambda v: _number(v) and v >= 0,
    "routing": lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
    # Each logged value per epoch: numbers, NaN and inf included (a diverged training's loss).
    "history": lambda v: isinstance(v, dict) and all(_logged(x) for x in v.values()),
}
_OPTIONAL_ROW_ENTRIES = {
    "arm": lambda v: v is None or isinstance(v, str),
    "sinkhorn_iterations": lambda v: _count(v) and v > 0,
    "shuffle_initializer": lambda v: v in ("random", "manual"),
    "shuffle_forward": lambda v: v in ("relaxed", "hard"),
    "search_epochs": lambda v: v is None or _count(v),
    "balanced": lambda v: isinstance(v, bool),
    "search_penalty": lambda v: v is None or (_number(v) and v >= 0),
    "equals_manual": lambda v: isinstance(v, bool),
}


def check_row(path, row, spec, settings):
    """`row` (read from `path`) if it is a result row of `spec`'s run: every entry of the
    right type and range (accuracies in [0, 1], numbers finite) and the run's name, seed,
    model, shuffle, lambda and epochs; else RunDirectoryError naming the file."""
    if not isinstance(row, dict):
        raise RunDirectoryError(
            f"The result row {path} is not an object. {_REBUILD} Received: {_shown(row)}"
        )
    missing = [key for key in _ROW_ENTRIES if key not in row]
    if missing:
        raise RunDirectoryError(f"The result row {path} lacks {', '.join(missing)}. {_REBUILD}")
    checks = {**_ROW_ENTRIES, **{k: v for k, v in _OPTIONAL_ROW_ENTRIES.items() if k in row}}
    for key, check in checks.items():
        if not check(row[key]):
            raise RunDirectoryError(
                f"The result row {path} holds an invalid {key}. {_REBUILD} "
                f"Received: {key}={_shown(row[key])}"
            )
    if row["harden_at_epoch"] is not None and row["harden_at_epoch"] >= row["epochs"]:
        raise RunDirectoryError(
            f"The result row {path} holds an invalid harden_at_epoch (at most epochs - 1 = "
            f"{_shown(row['epochs'] - 1)}). {_REBUILD} "
            f"Received: harden_at_epoch={_shown(row['harden_at_epoch'])}"
        )
    expected = {
        "name": spec.name,
        "seed": spec.seed,
        "model": spec.model,
        "shuffle": spec.shuffle,
        "lambda": spec.penalty,
        "epochs": settings.epochs,
    }
    differ = [key for key, value in expected.items() if row[key] != value]
    if differ:
        raise RunDirectoryError(
            f"The result row {path} is not the row of run {spec.name} (copied from another "
            f"run?). {_REBUILD} Received: "
            + ", ".join(f"{k}={_shown(row[k])} (the run's: {expected[k]!r})" for k in differ)
        )
    return row


def _train(settings, splits, spec, output_dir):
    train_data, test_data = splits
    recipe = training.get_recipe(
        recipe_name(settings.dataset),
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        penalty=spec.penalty,
        learning_rate=settings.learning_rate,
    )
    width = settings.v1_width if spec.model == "v1" else settings.v2_width
    model_fn = training.make_model_fn(
        spec.model,
        width,
        spec.shuffle,
        spec.penalty,
        train_data,
        "cifar",
        padding=settings.padding,
        sinkhorn_iterations=spec.sinkhorn_iterations,
        shuffle_initializer=spec.shuffle_initializer,
        shuffle_forward=spec.shuffle_forward,
    )
    snapshot = _Snapshot(output_dir)
    learned = spec.shuffle == "auto" and spec.search_epochs is None
    monitor = RoundingMonitor(test_data.eval_dataset(settings.batch_size))
    run_settings = {"sinkhorn_iterations": spec.sinkhorn_iterations}
    if spec.arm is not None:  # rows from before the arms keep their recorded settings
        run_settings.update(
            shuffle_initializer=spec.shuffle_initializer, shuffle_forward=spec.shuffle_forward
        )
    arguments = dict(
        seed=spec.seed,
        export=False,
        settings=run_settings,
        callbacks=[monitor, snapshot] if learned else [snapshot],
        harden_at_epoch=spec.harden_at_epoch,
        verbose=0,
    )
    if spec.search_epochs is None:
        training.train(model_fn, train_data, test_data, recipe, output_dir, **arguments)
    else:
        training.search_then_retrain(
            model_fn,
            train_data,
            test_data,
            recipe,
            output_dir,
            search_epochs=spec.search_epochs,
            balanced=spec.balanced,
            **arguments,
        )


def _row_from_files(settings, test_data, spec, output_dir):
    report = _read_json(os.path.join(output_dir, "report.json"))
    epochs = _read_json(os.path.join(output_dir, "epochs.json")) or {}
    history = {}
    for epoch in sorted(epochs, key=int):
        for key, value in epochs[epoch].items():
            history.setdefault(key, []).append(value)
    model_path = os.path.join(output_dir, "model.keras")
    # The final accuracy is recomputed from the saved hardened model, not taken from training.
    hardened = keras.saving.load_model(model_path, safe_mode=True)
    search = report.get("search") or {}
    routing_difference = hardening.routing_difference(hardened)
    return {
        "name": spec.name,
        "arm": spec.arm,
        "shuffle_initializer": spec.shuffle_initializer,
        "shuffle_forward": spec.shuffle_forward,
        "search_epochs": spec.search_epochs,
        "balanced": spec.balanced,
        # P(M) where the routing was chosen: at the search's hardening for searched arms.
        "search_penalty": search.get("l12_penalty_at_hardening"),
        "model": spec.model,
        "shuffle": spec.shuffle,
        "lambda": spec.penalty,
        "seed": spec.seed,
        "epochs": settings.epochs,
        "harden_at_epoch": spec.harden_at_epoch,
        "sinkhorn_iterations": spec.sinkhorn_iterations,
        "relaxed_accuracy": report.get("relaxed_accuracy"),
        "rounded_accuracy": report.get("rounded_accuracy"),
        "relative_change": report.get("relative_change"),
        "final_accuracy": evaluate_saved(hardened, test_data, settings.batch_size),
        "penalty": report["l12_penalty_at_hardening"],
        "routing_difference": routing_difference,
        # Equal counts: the manual function class (a re-parametrised manual net).
        "equals_manual": routing_difference == 0.0,
        "routing": [
            {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in entry.items()}
            for entry in hardening.routing_counts(hardened)
        ],
        "seconds": report["time"],
        # Relative to the study's folder: rows stay valid on another machine.
        "model_path": os.path.join("runs", spec.name, "model.keras"),
        "history": history,
    }


def _with_arrays(row, output_dir):
    """The row with its first relaxed matrix and first hardened permutation (for figures)."""
    matrices_path = os.path.join(output_dir, "relaxed.npz")
    first_matrix = None
    if os.path.exists(matrices_path):
        with np.load(matrices_path) as saved:
            first_matrix = saved["arr_0"] if "arr_0" in saved else None
    first = None
    model_path = os.path.join(output_dir, "model.keras")
    if os.path.exists(model_path):  # only the rows may be kept (docs/fashion_mnist)
        model = keras.saving.load_model(model_path, safe_mode=True)
        first = next(iter(shuffle_layers(model)), None)
    return {
        **row,
        "time": row["seconds"],
        "_first_matrix": first_matrix,
        "_first_permutation": None if first is None else np.asarray(first.permutation),
    }


def evaluate_saved(model, test_data, batch_size=64):
    """Test accuracy of a (loaded) model, computed with NumPy from its predictions."""
    correct = total = 0
    for images, labels in test_data.eval_dataset(batch_size):
        predicted = np.argmax(model.predict_on_batch(images), axis=-1)
        correct += int(np.sum(predicted == labels.numpy()))
        total += int(labels.shape[0])
    return correct / total


def run_all(settings, specs, runs_dir, log=print, jobs=1):
    """Runs (or reads back) every spec; returns {name: row}. `jobs` > 1: that many
    trainings at once, each in its own process with `cpu_count // jobs` TF threads."""
    _validation.positive_int(jobs, "jobs")
    rows = {}
    if jobs == 1:
        for spec in specs:
            rows[spec.name] = _log(log, spec.name, _run_job(settings, spec, runs_dir))
        return rows
    context = multiprocessing.get_context("spawn")  # TF is not fork-safe
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_init_worker, initargs=(threads,)
    ) as pool:
        futures = {pool.submit(_run_job, settings, spec, runs_dir): spec for spec in specs}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future].name
            rows[name] = _log(log, name, future.result())
    return rows


def _init_worker(threads):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def _run_job(settings, spec, runs_dir):
    """One training: the splits are loaded once per process (seeded data order)."""
    key = (
        settings.dataset,
        spec.seed,
        settings.max_train_examples,
        getattr(settings, "data_dir", None),
    )
    if key not in _SPLITS:
        splits = data.load(
            settings.dataset, seed=spec.seed, data_dir=getattr(settings, "data_dir", None)
        )
        if settings.max_train_examples:
            splits = (splits[0].subset(settings.max_train_examples), splits[1])
        _SPLITS[key] = splits
    return run_one(settings, _SPLITS[key], spec, os.path.join(runs_dir, spec.name))


# Splits per (data set, seed, subset) in this process: loading Fashion-MNIST takes seconds.
_SPLITS = {}


def _log(log, name, row):
    log(
        f"{name}: relaxed {row['relaxed_accuracy']:.4f} rounded {row['rounded_accuracy']:.4f}"
        f" penalty {row['penalty']:.3g} ({row['time']:.0f} s)"
    )
    return row
