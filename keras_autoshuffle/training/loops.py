"""`train()`: builds, trains, hardens and exports one model.

`fit` on one host (one device or MirroredStrategy, here); a custom step under
MultiWorkerMirroredStrategy (`multi_worker.py`). Both harden through
`hardening.harden_and_evaluate` and write the same report.
"""

import collections
import dataclasses
import os
import time

import keras

from keras_autoshuffle import _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle._atomic import write_json
from keras_autoshuffle.callbacks import HardenShuffles, evaluate_accuracy
from keras_autoshuffle.data import EpochCounter
from keras_autoshuffle.training import distribution
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE
from keras_autoshuffle.training.exports import (
    check_int8,
    check_savable,
    export_formats,
    export_run,
    int8_data,
    plan_export,
)
from keras_autoshuffle.training.fault_tolerance import finish_run, prepare_run_directory
from keras_autoshuffle.training.job import BALANCED_TIME_LIMIT, TrainingJob
from keras_autoshuffle.training.multi_worker import custom_loop
from keras_autoshuffle.training.recipes import make_optimizer
from keras_autoshuffle.training.records import ElapsedTime, elapsed_before
from keras_autoshuffle.training.run_files import BACKUP, read_json

__all__ = ["BALANCED_TIME_LIMIT", "train"]


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
            `history.csv`, `logs/` and the `backup/` of a running job go (removed after
            `report.json`, the last file). Every file is written atomically. A killed
            run resumes from its backup when rerun with the same settings. No model is
            chosen on the test split: `model.keras` is the last epoch's, hardened.
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
            `exports.INT8_CALIBRATION_EXAMPLES` training images (unaugmented), checked on the test
            set (its first `exports.INT8_TEST_EXAMPLES`) with `export_model`'s default
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
    harden_at_epoch = _check_harden_at_epoch(harden_at_epoch, recipe, multi_worker)
    _validation.choice(balanced, (False, True), "balanced")
    seed = _check_seed(seed)
    formats = export_formats(export)
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
        formats, skipped = plan_export(model, formats if chief else ())
        check_int8(int8, formats, skipped, chief)
        sample = check_savable(model, test_data, formats)
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
        elapsed = ElapsedTime(os.path.join(own_dir, BACKUP), start, elapsed_before(own_dir))
        job = TrainingJob(
            model,
            optimizer,
            strategy,
            train_data,
            test_data,
            recipe,
            own_dir,
            elapsed,
            extra_callbacks=list(callbacks or []),
            jit_compile=jit_compile,
            verbose=verbose if chief else 0,
            balanced=balanced,
            harden_at_epoch=harden_at_epoch,
        )
        report = custom_loop(job) if multi_worker else _fit(job)
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
        int8_arrays = int8_data(train_data, test_data) if int8 and chief else None
        report["export"] = export_run(model, own_dir, sample, formats, int8_arrays)
        if int8_arrays is not None:
            report["int8"] = report["export"].pop("int8")
        files.update({name: entry["path"] for name, entry in report["export"].items()})
        if int8_arrays is not None and report["int8"]["path"]:
            files["int8"] = report["int8"]["path"]
    else:
        export_lib.save_keras(model, files["keras"])
    if skipped:
        report["export_skipped"] = skipped
    files.update(
        history=job.history_path,
        logs=os.path.join(own_dir, "logs"),
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
    divergence = os.path.join(job.backup_dir, DIVERGENCE_FILE)
    if os.path.exists(divergence):
        report["resumed_after_divergence"] = read_json(divergence, "divergence record")
    report.update(report_entries or {})
    write_json(report["files"]["report"], report)
    finish_run(own_dir)
    return report


def _check_harden_at_epoch(harden_at_epoch, recipe, multi_worker):
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
    return harden_at_epoch


def _check_seed(seed):
    seed = _validation.non_negative_int(seed, "seed")
    if seed >= 2**32:  # NumPy's and TensorFlow's seeds are 32-bit
        raise ValueError(f"`seed` must be an integer in [0, 2**32 - 1]. Received: seed={seed!r}")
    return seed


def _fit(job):
    """Keras's `fit` on one host (one device or MirroredStrategy), hardening with
    `HardenShuffles` (after `job.harden_at_epoch` epochs, or at the end); the report."""
    model, recipe = job.model, job.recipe
    with job.strategy.scope():
        model.compile(
            optimizer=job.optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=job.jit_compile,
        )
    counter = EpochCounter()
    test = job.test_data.eval_dataset(recipe.batch_size)
    hardening = HardenShuffles(
        validation_data=test,
        at_epoch=job.harden_at_epoch,
        verbose=int(job.verbose > 0),
        balanced=job.balanced,
        time_limit=job.time_limit,
    )
    model.fit(
        job.train_data.fit_dataset(recipe.batch_size, counter),
        epochs=recipe.epochs,
        validation_data=test,
        callbacks=[counter.callback(), *job.callbacks(hardening)],
        shuffle=False,  # the order is the dataset's, a function of (seed, epoch)
        verbose=job.verbose,
    )
    report = dict(hardening.report)
    # Hardened before the end: the net trained on, so its final accuracy is measured anew.
    report["final_accuracy"] = (
        report.get("rounded_accuracy")
        if report["epoch"] is None
        else evaluate_accuracy(model, test)[1]
    )
    return report
