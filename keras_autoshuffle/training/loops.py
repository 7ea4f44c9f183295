"""`train()`: builds, trains, hardens and exports one model.

`fit` on one host (one device or MirroredStrategy, here); a custom step under
MultiWorkerMirroredStrategy (`multi_worker.py`). Both harden through
`hardening.harden_and_evaluate` and write the same report.
"""

import collections
import dataclasses
import os
import time
import warnings

import keras

from keras_autoshuffle import _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle.callbacks import HardenShuffles, ShufflePenaltyLogger, evaluate_accuracy
from keras_autoshuffle.data import EpochCounter
from keras_autoshuffle.training import distribution
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE, StopOnDivergence
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    BestModel,
    ElapsedTime,
    HardeningRecord,
    HistoryLog,
    RunBackup,
    elapsed_before,
    finish_run,
    prepare_run_directory,
    read_json,
    write_json,
)
from keras_autoshuffle.training.multi_worker import custom_loop
from keras_autoshuffle.training.recipes import make_optimizer

# Seconds per layer for balanced hardening (then the best balanced permutation so far).
BALANCED_TIME_LIMIT = 60
# `int8=True`: training images calibrated on, and at most this many test examples checked.
INT8_CALIBRATION_EXAMPLES = 500
INT8_TEST_EXAMPLES = 10000


def train(
    model_fn,
    train_data,
    test_data,
    recipe,
    output_dir,
    *,
    strategy="auto",
    mixed_precision=False,
    jit_compile=False,
    seed=0,
    export=True,
    settings=None,
    callbacks=None,
    harden_at_epoch=None,
    balanced=False,
    overwrite=False,
    verbose=1,
    report_entries=None,
    int8=False,
):
    """Trains, hardens and exports a model; writes everything into `output_dir`.

    Everything that can be checked before the first epoch is (the arguments, the data,
    the output folder, the export formats, that the model can be saved and loaded), so
    a run does not fail after its training. A run killed at any instant and rerun with
    the same arguments resumes from its last completed epoch, or, when training was
    complete, redoes only the hardening, export and report; a run whose loss or weights
    become non-finite stops with TrainingDivergedError and resumes from its last good
    epoch (`fault_tolerance`, `divergence`).

    Args:
        model_fn: builds the (uncompiled) Keras model; called under the strategy's
            scope and the dtype policy. Its outputs are class probabilities (softmax).
        train_data, test_data: `keras_autoshuffle.data.EpochData` splits.
        recipe: a `Recipe` (see `get_recipe`).
        output_dir: where `model.keras`, `saved_model/`, `model.tflite`, `report.json`,
            `history.csv`, `logs/`, `best.keras` and the `backup/` of a running job go
            (removed after `report.json`, the last file). Every file is written
            atomically. A killed run resumes from its backup when rerun with the same
            settings.
        strategy: a `tf.distribute.Strategy` or a name in STRATEGIES. Create a
            MultiWorkerMirroredStrategy (`make_strategy("multi-worker")`) at program
            start, before TensorFlow runs any op, and pass it here.
        mixed_precision: float16 on GPU, bfloat16 on CPU (shuffle matrices stay float32).
        jit_compile: XLA (off by default: measured 4x slower on CPU).
        seed: seeds the initial weights, the data order and the augmentation (an
            integer in [0, 2**32 - 1]).
        export: the files besides `model.keras`, each checked against Keras: True for
            SavedModel and LiteRT where this backend, these packages and the dtype
            policy allow them (one they do not is left out with a warning, and named
            in the report's `export_skipped`); a list of formats of `export.FORMATS`
            to write exactly those (one that cannot be written is refused before
            training); False for none.
        settings: extra entries for the report's `settings` (and the resume check).
        callbacks: extra Keras callbacks, run after the built-in ones: after each epoch's
            backup, and after the hardening at the end of training.
        harden_at_epoch: harden after this many epochs and fine-tune the rest of the
            network with the permutations fixed (`HardenShuffles(at_epoch=...)`); default:
            harden at the end (the paper). Not with the multi-worker strategy.
        balanced: balanced hardening (`harden_model(balanced=True)`): permutations that
            fold into a network as cheap as the manual one (the manual routing counts).
        overwrite: replace a finished run in `output_dir` (default: refuse).
        verbose: 0 silent, 1 Keras's progress bar, 2 one line per epoch.
        report_entries: a dict of entries added to the report before it is written.
        int8: also write `model_int8.tflite`, full-integer LiteRT of the folded network
            (float32 inputs and outputs) calibrated on the first
            INT8_CALIBRATION_EXAMPLES training images (unaugmented), checked on the test
            set (its first INT8_TEST_EXAMPLES examples) with `export_model`'s default
            thresholds: the report's `int8` entry holds its accuracy, the float model's,
            their top-1 agreement and the size ratio to `model.tflite`. Needs the LiteRT
            export (Keras's TensorFlow backend, ai_edge_litert, float32): refused before
            training where it cannot be written.

    Returns:
        The report dict (also written to `report.json`).
    """
    start = time.time()
    strategy = distribution.make_strategy(strategy) if isinstance(strategy, str) else strategy
    multi_worker = distribution.is_multi_worker(strategy)
    harden_at_epoch = _validation.optional_positive_int(harden_at_epoch, "harden_at_epoch")
    if harden_at_epoch is not None and multi_worker:
        raise ValueError(
            "`harden_at_epoch` works with fit (one host), not the multi-worker loop. "
            f"Received: harden_at_epoch={harden_at_epoch}"
        )
    if harden_at_epoch is not None and harden_at_epoch >= recipe.epochs:
        raise ValueError(
            f"`harden_at_epoch` must be in [1, {recipe.epochs - 1}] (epochs={recipe.epochs}). "
            f"Received: harden_at_epoch={harden_at_epoch}"
        )
    _validation.choice(balanced, (False, True), "balanced")
    seed = _check_seed(seed)
    formats = _export_formats(export)
    if test_data.num_examples < 1:
        raise ValueError(
            "`test_data` holds no examples: nothing to evaluate the hardening on or to check "
            f"the exports with. Received: test_data with {test_data.num_examples} examples"
        )
    if recipe.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f"The global batch size must divide by the {strategy.num_replicas_in_sync} "
            f"replicas. Received: batch_size={recipe.batch_size}"
        )
    chief = distribution.is_chief(strategy)
    own_dir = (
        output_dir
        if chief
        else os.path.join(output_dir, f"worker-{distribution.task_id(strategy)}")
    )
    previous_policy = keras.config.dtype_policy()
    if mixed_precision:
        keras.config.set_dtype_policy(distribution.mixed_precision_policy())
    try:
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            model = model_fn()
            steps = train_data.steps(recipe.batch_size)
            if steps < 1:
                raise ValueError(
                    f"The batch size is larger than the {train_data.num_examples} training "
                    f"examples (no full batch per epoch). Received: batch_size={recipe.batch_size}"
                )
            optimizer = make_optimizer(recipe, steps, model)
        formats, skipped = _plan_export(model, formats if chief else ())
        _check_int8(int8, formats, skipped, chief)
        sample = _check_savable(model, test_data, formats)
        run_settings = {
            **(settings or {}),
            **dataclasses.asdict(recipe),
            "epochs": recipe.epochs,
            "model_name": model.name,
            "parameters": int(model.count_params()),
            # The graph, coarsely: a builder change (e.g. its padding) is not resumed into.
            "layer_types": dict(
                sorted(collections.Counter(type(x).__name__ for x in model.layers).items())
            ),
            "mixed_precision": distribution.mixed_precision_policy() if mixed_precision else False,
            "seed": seed,
            "harden_at_epoch": harden_at_epoch,
            "balanced": balanced,
            "train_examples": train_data.num_examples,
            "test_examples": test_data.num_examples,
        }
        prepare_run_directory(own_dir, run_settings, overwrite=overwrite)
        backup_dir = os.path.join(own_dir, BACKUP)
        elapsed = ElapsedTime(backup_dir, start, elapsed_before(own_dir))
        stop = StopOnDivergence(backup_dir, recipe.learning_rates)
        history_path = os.path.join(own_dir, "history.csv")
        if multi_worker:
            report = custom_loop(
                model,
                optimizer,
                strategy,
                train_data,
                test_data,
                recipe,
                _callbacks(own_dir, history_path, chief, list(callbacks or []), stop, elapsed),
                jit_compile=jit_compile,
                verbose=verbose if chief else 0,
                balanced=balanced,
                time_limit=BALANCED_TIME_LIMIT,
            )
        else:
            report = _fit(
                model,
                optimizer,
                strategy,
                train_data,
                test_data,
                recipe,
                own_dir,
                history_path,
                stop=stop,
                jit_compile=jit_compile,
                verbose=verbose,
                extra=list(callbacks or []),
                balanced=balanced,
                harden_at_epoch=harden_at_epoch,
                elapsed=elapsed,
            )
    finally:
        keras.config.set_dtype_policy(previous_policy)

    report["layers"] = [
        {k: v for k, v in layer.items() if k != "permutation"} for layer in report["layers"]
    ]
    # P(M) summed over the shuffles when they were rounded (after that every P is 0).
    report["l12_penalty_at_hardening"] = float(
        sum(layer["l12_penalty"] for layer in report["layers"])
    )
    files = {"keras": os.path.join(own_dir, "model.keras")}
    if formats:
        int8_data = _int8_data(train_data, test_data) if int8 and chief else None
        report["export"] = _export(model, own_dir, sample, formats, int8_data)
        if int8_data is not None:
            report["int8"] = report["export"].pop("int8")
        files.update({name: entry["path"] for name, entry in report["export"].items()})
        if int8_data is not None and report["int8"]["path"]:
            files["int8"] = report["int8"]["path"]
    else:
        export_lib.save_keras(model, files["keras"])
    if skipped:
        report["export_skipped"] = skipped
    files.update(
        history=history_path,
        logs=os.path.join(own_dir, "logs"),
        best=os.path.join(own_dir, "best.keras"),
        report=os.path.join(own_dir, "report.json"),
    )
    report["files"] = {k: v for k, v in files.items() if os.path.exists(v) or k == "report"}
    report["settings"] = {
        **run_settings,
        "strategy": distribution.strategy_name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "jit_compile": jit_compile,
    }
    # Every invocation's training time: a resumed run's backup kept the earlier ones'.
    report["time_this_invocation"] = time.time() - start
    report["time"] = elapsed.before + report["time_this_invocation"]
    divergence = os.path.join(backup_dir, DIVERGENCE_FILE)
    if os.path.exists(divergence):
        report["resumed_after_divergence"] = read_json(divergence, "divergence record")
    report.update(report_entries or {})
    write_json(report["files"]["report"], report)
    finish_run(own_dir)
    return report


def _check_seed(seed):
    seed = _validation.non_negative_int(seed, "seed")
    if seed >= 2**32:  # NumPy's and TensorFlow's seeds are 32-bit
        raise ValueError(f"`seed` must be an integer in [0, 2**32 - 1]. Received: seed={seed!r}")
    return seed


def _export_formats(export):
    """None: every format where possible (`export=True`); else the formats asked for."""
    if export is True:
        return None
    if export is False:
        return ()
    try:
        return export_lib.check_formats(export)
    except ValueError:
        raise ValueError(
            f"`export` must be True, False or a list of formats of {export_lib.FORMATS}. "
            f"Received: export={export!r}"
        ) from None


def _plan_export(model, formats):
    """(formats to export besides .keras, {format: why not} for those left out)."""
    auto = formats is None
    formats = ("saved_model", "litert") if auto else tuple(f for f in formats if f != "keras")
    if formats and len(model.inputs) != 1:
        raise ValueError(
            "The export checks support single-input models: pass export=False. Received: "
            f"a model with {len(model.inputs)} inputs"
        )
    unsupported = export_lib.unsupported_formats(formats, export_lib.compute_dtypes(model))
    if unsupported and not auto:
        raise ValueError(
            "These export formats cannot be written for this run: "
            + "; ".join(f"{name}: {why}" for name, why in unsupported.items())
            + ". Leave them out (or pass export=True to drop what cannot be exported). "
            f"Received: export={formats}"
        )
    for name, why in unsupported.items():
        warnings.warn(
            f"The run will not export {name}: {why}. (Listed in `export`, a format that cannot "
            "be written stops the run before training instead.)",
            stacklevel=3,
        )
    return tuple(f for f in formats if f not in unsupported), unsupported


def _check_int8(int8, formats, skipped, chief):
    """Refuses `int8=True` before training where the LiteRT export cannot be written."""
    _validation.choice(int8, (False, True), "int8")
    if int8 and chief and "litert" not in formats:
        why = skipped.get("litert", "the run does not export LiteRT (`export`)")
        raise ValueError(
            f"`int8=True` needs the LiteRT export, which this run cannot write: {why}. "
            f"Received: int8=True with export formats {formats}"
        )


def _int8_data(train_data, test_data):
    """(calibration images, (test images, test labels)) for the int8 export."""
    import numpy as np

    def take(data, count):
        images, labels = [], []
        for batch in data.eval_dataset(256):
            images.append(keras.ops.convert_to_numpy(batch[0]))
            labels.append(keras.ops.convert_to_numpy(batch[1]))
            if sum(len(x) for x in images) >= count:
                break
        return np.concatenate(images)[:count], np.concatenate(labels)[:count]

    calibration, _ = take(train_data, INT8_CALIBRATION_EXAMPLES)
    return calibration, take(test_data, INT8_TEST_EXAMPLES)


def _check_savable(model, test_data, formats):
    """Checks before training what the end of the run needs: the model's config loads
    back in safe mode (`model.keras`), and a batch of test images for the export checks
    (returned when exporting)."""
    try:
        config = keras.saving.serialize_keras_object(model)
        keras.saving.deserialize_keras_object(config, safe_mode=True)
    except Exception as error:  # whatever Keras raises: the model cannot be saved as built
        raise ValueError(
            "The model cannot be saved and loaded as a .keras file (register its custom "
            "objects with keras.saving.register_keras_serializable, avoid Lambda layers). "
            f"Received: {type(error).__name__}: {str(error)[:300]}"
        ) from None
    if not formats:
        return None
    return keras.ops.convert_to_numpy(next(iter(test_data.eval_dataset(8)))[0])


def _export(model, output_dir, sample, formats, int8_data=None):
    """`model.keras` as trained (hardened); `formats` (SavedModel, LiteRT) from the folded
    network, and with `int8_data` (calibration images, test data) its int8 LiteRT.

    Folding (`folding.fold_model`) removes the shuffles' GATHERs, which split LiteRT's
    XNNPACK delegate; models it does not cover (not from `applications`, channels_first)
    are exported as they are. Every file's max abs difference is against the hardened
    model.
    """
    from keras_autoshuffle import folding

    results = export_lib.export_model(model, output_dir, sample, formats=("keras",))
    folded = folding.is_foldable(model)
    inference = folding.fold_model(model, name=model.name) if folded else model
    int8 = {}
    if int8_data is not None:
        int8 = dict(quantize="int8", representative_data=int8_data[0], test_data=int8_data[1])
    try:
        files = export_lib.export_model(
            inference, output_dir, sample, formats=formats, reference=model, **int8
        )
    except export_lib.Int8CheckError as error:
        # Training is over: keep the float files and the report, refuse only the int8 file.
        files = export_lib.export_model(
            inference, output_dir, sample, formats=formats, reference=model
        )
        files["int8"] = {**error.check, "path": None, "refused": str(error)}
    for name, entry in files.items():
        results[name] = {**entry, "folded": folded}
    return results


def _callbacks(output_dir, history_path, chief, extra, stop, elapsed, hardening=None):
    """The run's callbacks in order: the divergence check first (a diverged epoch reaches
    no log, checkpoint or backup), logging (ShufflePenaltyLogger before the loggers),
    hardening and its record, the elapsed time, the backup, then the user's. So the backup
    of the hardening epoch holds the hardened weights, the end-of-training hardening is
    recorded before the run's files are written, and a user's callback sees each epoch
    backed up."""
    backup_dir = os.path.join(output_dir, BACKUP)
    callbacks = [
        stop,
        ShufflePenaltyLogger(),
        BestModel(os.path.join(output_dir, "best.keras"), backup_dir) if chief else None,
        keras.callbacks.TensorBoard(os.path.join(output_dir, "logs"), write_graph=False),
        HistoryLog(history_path),
        hardening,
        None if hardening is None else HardeningRecord(backup_dir, hardening),
        elapsed,
        RunBackup(backup_dir),
        *extra,
    ]
    return [c for c in callbacks if c is not None]


def _fit(
    model,
    optimizer,
    strategy,
    train_data,
    test_data,
    recipe,
    output_dir,
    history_path,
    stop,
    jit_compile,
    verbose,
    extra=(),
    harden_at_epoch=None,
    balanced=False,
    elapsed=None,
):
    with strategy.scope():
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=jit_compile,
        )
    counter = EpochCounter()
    test = test_data.eval_dataset(recipe.batch_size)
    hardening = HardenShuffles(
        validation_data=test,
        at_epoch=harden_at_epoch,
        verbose=int(verbose > 0),
        balanced=balanced,
        time_limit=BALANCED_TIME_LIMIT,
    )
    model.fit(
        train_data.fit_dataset(recipe.batch_size, counter),
        epochs=recipe.epochs,
        validation_data=test,
        callbacks=[
            counter.callback(),
            *_callbacks(output_dir, history_path, True, extra, stop, elapsed, hardening),
        ],
        shuffle=False,  # the order is the dataset's, a function of (seed, epoch)
        verbose=verbose,
    )
    report = dict(hardening.report)
    # Hardened before the end: the net trained on, so its final accuracy is measured anew.
    report["final_accuracy"] = (
        report.get("rounded_accuracy")
        if report["epoch"] is None
        else evaluate_accuracy(model, test)[1]
    )
    return report
