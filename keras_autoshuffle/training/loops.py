"""`train()`: builds, trains, hardens and exports one model.

`fit` on one host (one device or MirroredStrategy, here); a custom step under
MultiWorkerMirroredStrategy (`multi_worker.py`). Both harden through
`hardening.harden_and_evaluate` and write the same report.
"""

import collections
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import keras
import tensorflow as tf

from keras_autoshuffle import _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle._atomic import write_json
from keras_autoshuffle._dtype_policy import global_dtype_policy
from keras_autoshuffle._keras_internals import build_before_fit
from keras_autoshuffle.callbacks import HardenShuffles, evaluate_accuracy
from keras_autoshuffle.data import EpochCounter, EpochData
from keras_autoshuffle.export import int8_runtimes
from keras_autoshuffle.losses import SmoothedSparseCrossentropy
from keras_autoshuffle.training import distribution
from keras_autoshuffle.training.exports import (
    check_calibration_images,
    check_savable,
    export_formats,
    export_run,
    int8_data,
    plan_export,
)
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    DIVERGENCE_FILE,
    ElapsedTime,
    finish_run,
    prepare_run_directory,
    read_json,
)
from keras_autoshuffle.training.identity import RunIdentity, recipe_fields
from keras_autoshuffle.training.job import BALANCED_TIME_LIMIT, TrainingJob, loop_report
from keras_autoshuffle.training.multi_worker import custom_loop
from keras_autoshuffle.training.recipes import Recipe, make_optimizer

__all__ = ["BALANCED_TIME_LIMIT", "train"]


def train(
    model_fn: Callable[[], keras.Model],
    train_data: EpochData,
    test_data: EpochData,
    recipe: Recipe,
    output_dir: str | os.PathLike,
    *,
    strategy: tf.distribute.Strategy
    | Literal["auto", "one-device", "mirrored", "multi-worker"] = "auto",
    mixed_precision: bool = False,
    jit_compile: bool = False,
    seed: int = 0,
    export: bool | Sequence[str] = True,
    settings: dict[str, Any] | None = None,
    callbacks: Sequence[keras.callbacks.Callback] | None = None,
    harden_at_epoch: int | None = None,
    balanced: bool = False,
    overwrite: bool = False,
    verbose: Literal[0, 1, 2] = 1,
    report_entries: dict[str, Any] | None = None,
    int8: bool = False,
    max_accuracy_drop: float = export_lib.MAX_ACCURACY_DROP,
    int8_weight_bits: int = int8_runtimes.DEFAULT_WEIGHT_BITS,
    label_smoothing: float = 0.0,
    class_weight: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Trains, hardens and exports a model into `output_dir`; returns the report (also
    written to `report.json`).

    What can be checked before the first epoch is. A run killed at any instant and rerun
    with the same `RunIdentity` resumes from its last completed epoch (or redoes only what
    came after training); a non-finite loss stops it with TrainingDivergedError, and a
    rerun with a lower learning rate resumes from its last good epoch.

    Args:
        model_fn: builds the uncompiled model (class probabilities out), called under
            the strategy's scope and the dtype policy.
        train_data: the training split, a `keras_autoshuffle.data.EpochData`.
        test_data: the test split, a `keras_autoshuffle.data.EpochData`.
        recipe: a `Recipe` (see `get_recipe`).
        output_dir: the run's folder: `model.keras` (the last epoch's, hardened), the
            exports, `report.json` (last), `history.csv`, `logs/`, and `backup/` until
            the report; every file is written atomically.
        strategy: a `tf.distribute.Strategy` or a name in STRATEGIES (a multi-worker one
            made with `make_strategy` at program start, before any TF op).
        mixed_precision: float16 on GPU, bfloat16 on CPU (shuffle matrices stay float32).
        jit_compile: XLA (off by default: measured 4x slower on CPU).
        seed: of the initial weights, data order and augmentation, in [0, 2**32 - 1].
        export: True: SavedModel and LiteRT where possible (others skipped with a warning,
            in the report's `export_skipped`); a list of `export.FORMATS`: exactly those,
            refused before training where one cannot be written; False: none.
        settings: `RunIdentity` fields beyond those `train()` fills (the identity a
            resume must match, and the report's `settings`).
        callbacks: extra Keras callbacks, run after the built-in ones (after each backup).
        harden_at_epoch: harden after this many epochs, then fine-tune with the
            permutations fixed (default: at the end); not multi-worker.
        balanced: balanced hardening (`harden_model(balanced=True)`).
        overwrite: replace a finished run in `output_dir` (default: refuse).
        verbose: 0 silent, 1 progress bar, 2 one line per epoch.
        report_entries: entries added to the report before it is written.
        int8: also the folded net's full-integer files beside the LiteRT, ONNX and
            OpenVINO exports, calibrated and checked (`export.export_model`).
        max_accuracy_drop: with `int8`, the most an int8 file's test accuracy may be below
            the float model's, in percentage points in [0, 100]; a file beyond it is not
            written, its numbers reported.
        int8_weight_bits: with `int8`, the ONNX and OpenVINO int8 files' weight bits: 7
            (right on every x86 CPU) or 8 (for CPUs with VNNI only).
        label_smoothing: in [0, 1): the loss's (`losses.SmoothedSparseCrossentropy`);
            0 is sparse cross-entropy.
        class_weight: None, or a weight per class, a sequence as long as the classes
            (Keras's `fit(class_weight=...)`); one host only.
    """
    start = time.time()
    strategy = distribution.make_strategy(strategy) if isinstance(strategy, str) else strategy
    harden_at_epoch = _check_harden_at_epoch(harden_at_epoch, recipe, strategy)
    _validation.choice(balanced, (False, True), "balanced")
    seed, formats = _validation.seed(seed), export_formats(export)
    _validation.choice(int8, (False, True), "int8")
    int8_bound = _validation.percentage_points(max_accuracy_drop, "max_accuracy_drop")
    weight_bits = int8_runtimes.check_weight_bits(int8_weight_bits, "int8_weight_bits")
    _check_data(test_data, recipe, strategy)
    loss = dict(label_smoothing=_validation.fraction_below_one(label_smoothing, "label_smoothing"))
    loss["class_weights"] = _check_class_weight(class_weight, train_data, strategy)
    if loss["label_smoothing"]:
        _fit_only("label_smoothing", label_smoothing, strategy)
    chief = distribution.is_chief(strategy)
    policy = distribution.mixed_precision_policy() if mixed_precision else False
    with global_dtype_policy(policy or None):
        keras.utils.set_random_seed(seed)
        model, optimizer = _build(model_fn, strategy, train_data, recipe)
        formats, skipped = _plan(model, formats if chief else (), int8 and chief)
        check_calibration_images(train_data.num_examples, int8 and chief)
        sample = check_savable(model, test_data, formats)
        hardening = dict(balanced=balanced, harden_at_epoch=harden_at_epoch)
        fields = dict(seed=seed, mixed_precision=policy, **hardening, **loss)
        identity = _identity(settings, recipe, model, train_data, test_data, **fields)
        parts = (model, optimizer, strategy, train_data, test_data, recipe)
        job = _start_job(parts, output_dir, identity, start, overwrite, verbose, **hardening)
        job.extra_callbacks, job.jit_compile = list(callbacks or []), jit_compile
        job.label_smoothing, job.class_weights = loss["label_smoothing"], loss["class_weights"]
        with reproducible_steps():
            report = custom_loop(job) if distribution.is_multi_worker(strategy) else _fit(job)
    int8_options = (int8 and chief, int8_bound, weight_bits)
    files = _export(job, sample, (formats, skipped), int8_options, report)
    if int8:
        identity = {**identity, "int8_weight_bits": weight_bits}  # the report's, not a resume's
    return _write_report(job, report, files, identity, start, report_entries)


@contextlib.contextmanager
def reproducible_steps() -> Iterator[None]:
    """TensorFlow's graph optimizer (Grappler) off meanwhile: one seed gives one training.

    With it on, learned-shuffle nets gave other gradients every few steps of one run
    repeated in one process (issue 39: TF's CPU `AddN` sums in an order set by which
    buffer it may reuse; `enable_op_determinism()` does not change that), at the same
    step time without it. GPUs (not bit-reproducible anyway) and other backends: nothing
    changed.
    """
    tf = None
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
    if tf is None or tf.config.list_logical_devices("GPU"):
        yield
        return
    key = "disable_meta_optimizer"
    previous = tf.config.optimizer.get_experimental_options().get(key, False)
    tf.config.optimizer.set_experimental_options({key: True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({key: previous})


def _check_data(test_data, recipe, strategy):
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


def _start_job(parts, output_dir, identity, start, overwrite, verbose, **options):
    """Prepares this process's run folder for `identity` (`prepare_run_directory`: a
    worker's own under multi-worker); the `TrainingJob` of `parts` (its first fields)."""
    strategy = parts[2]
    chief = distribution.is_chief(strategy)
    own_dir = os.path.join(output_dir, f"worker-{distribution.task_id(strategy)}")
    own_dir = output_dir if chief else own_dir
    prepare_run_directory(own_dir, identity, overwrite=overwrite)
    elapsed = ElapsedTime(os.path.join(own_dir, BACKUP), start)
    return TrainingJob(*parts, own_dir, elapsed, verbose=verbose if chief else 0, **options)


def _plan(model, formats, int8):
    """`plan_export` for `model` (single-input models only, where anything is exported)."""
    if formats != () and len(model.inputs) != 1:
        raise ValueError(
            "The export checks support single-input models: pass export=False. Received: "
            f"a model with {len(model.inputs)} inputs"
        )
    return plan_export(formats, export_lib.compute_dtypes(model), int8)


def _build(model_fn, strategy, train_data, recipe):
    """(model, optimizer), built under the strategy's scope."""
    with strategy.scope():
        model = model_fn()
        train_data.check_batch_size(recipe.batch_size)
        return model, make_optimizer(recipe, train_data.steps(recipe.batch_size), model)


def _identity(settings, recipe, model, train_data, test_data, **fields):
    """The run's `RunIdentity` record: `settings` and `fields`, the recipe's, and the
    network as built (its name, parameter count and layers counted by type: a builder
    change, e.g. its padding, is not resumed into) and the data's sizes."""
    counts = collections.Counter(type(x).__name__ for x in model.layers)
    return RunIdentity.make(
        settings,
        **recipe_fields(recipe),
        **fields,
        model_name=model.name,
        parameters=int(model.count_params()),
        layer_types=dict(sorted(counts.items())),
        train_examples=train_data.num_examples,
        test_examples=test_data.num_examples,
    ).record()


def _export(job, sample, plan, int8, report):
    """Writes `model.keras` and the exports of `plan` ((formats, {format: why skipped}))
    and, with `int8` ((wanted, max_accuracy_drop, weight bits)), the int8 files; their
    entries go into `report`; returns the files."""
    (model, own_dir), (formats, skipped) = (job.model, job.output_dir), plan
    files = {"keras": os.path.join(own_dir, "model.keras")}
    if skipped:
        report["export_skipped"] = skipped
    if not formats:
        export_lib.save_keras(model, files["keras"])
        return files
    int8_arrays = int8_data(job.train_data, job.test_data) if int8[0] else None
    report["export"] = export_run(model, own_dir, sample, formats, int8_arrays, *int8[1:])
    # Each int8 file's check ("int8": LiteRT's, "onnx_int8", "openvino_int8") beside the
    # float files' parity checks; a refused one has no path.
    for key in export_lib.INT8_FILES:
        if key in report["export"]:
            report[key] = report["export"].pop(key)
    files.update({name: entry["path"] for name, entry in report["export"].items()})
    for key in export_lib.INT8_FILES:
        if report.get(key, {}).get("path"):
            files[key] = report[key]["path"]
    return files


def _write_report(job, report, files, identity, start, report_entries):
    """Completes the report (its `settings`: the run's identity, the strategy, replicas
    and jit_compile), writes `report.json` (the run's last file) and removes the backup;
    returns the report."""
    strategy = job.strategy
    settings = {**identity, "strategy": distribution.strategy_name(strategy)}
    settings.update(replicas=strategy.num_replicas_in_sync, jit_compile=job.jit_compile)
    report["layers"] = [
        {k: v for k, v in layer.items() if k != "permutation"} for layer in report["layers"]
    ]
    # P(M) summed over the shuffles when they were rounded (after that every P is 0).
    report["l12_penalty_at_hardening"] = float(
        sum(layer["l12_penalty"] for layer in report["layers"])
    )
    files.update(
        history=os.path.join(job.output_dir, "history.csv"),
        logs=os.path.join(job.output_dir, "logs"),
        report=os.path.join(job.output_dir, "report.json"),
    )
    report["files"] = {k: v for k, v in files.items() if os.path.exists(v) or k == "report"}
    report["settings"] = settings
    # Every invocation's training time: a resumed run's backup kept the earlier ones'.
    report["time_this_invocation"] = time.time() - start
    report["time"] = job.elapsed.before + report["time_this_invocation"]
    divergence = os.path.join(job.output_dir, BACKUP, DIVERGENCE_FILE)
    if os.path.exists(divergence):
        report["resumed_after_divergence"] = read_json(divergence, "divergence record")
    report.update(report_entries or {})
    write_json(report["files"]["report"], report)
    finish_run(job.output_dir)
    return report


def _check_harden_at_epoch(harden_at_epoch, recipe, strategy):
    harden_at_epoch = _validation.optional_positive_int(harden_at_epoch, "harden_at_epoch")
    if harden_at_epoch is not None:
        _fit_only("harden_at_epoch", harden_at_epoch, strategy)
    if harden_at_epoch is not None and harden_at_epoch >= recipe.epochs:
        raise ValueError(
            f"`harden_at_epoch` must be in [1, {recipe.epochs - 1}] (epochs={recipe.epochs}). "
            f"Received: harden_at_epoch={harden_at_epoch}"
        )
    return harden_at_epoch


def _check_class_weight(class_weight, train_data, strategy):
    """`class_weight` as a tuple of floats, one per class (None: none); fit only."""
    if class_weight is None:
        return None
    classes = train_data.num_classes
    try:
        weights = tuple(_validation.positive_float(w, "class_weight") for w in class_weight)
    except TypeError:
        weights = ()
    if len(weights) != classes:
        raise ValueError(
            f"`class_weight` must hold a positive weight for each of the {classes} classes. "
            f"Received: class_weight={class_weight!r}"
        )
    _fit_only("class_weight", class_weight, strategy)
    return weights


def _fit_only(name, value, strategy):
    """ValueError naming `name` under the multi-worker loop (a setting only `fit` has)."""
    if distribution.is_multi_worker(strategy):
        raise ValueError(
            f"`{name}` works with fit (one host), not the multi-worker loop. "
            f"Received: {name}={value!r}"
        )


def _fit(job):
    """Keras's `fit` on one host (one device or MirroredStrategy), hardening with
    `HardenShuffles` (after `job.harden_at_epoch` epochs, or at the end); the report."""
    model, recipe = job.model, job.recipe
    loss = "sparse_categorical_crossentropy"
    if job.label_smoothing:
        loss = SmoothedSparseCrossentropy(job.label_smoothing)
    with job.strategy.scope():
        model.compile(
            optimizer=job.optimizer,
            loss=loss,
            metrics=["accuracy"],
            jit_compile=job.jit_compile,
        )
    counter = EpochCounter()
    train_data = job.train_data.fit_dataset(recipe.batch_size, counter)
    with job.strategy.scope():
        build_before_fit(model, train_data.element_spec)  # the step traced once, not twice
    test = job.test_data.eval_dataset(recipe.batch_size)
    hardening = HardenShuffles(
        validation_data=test,
        at_epoch=job.harden_at_epoch,
        verbose=int(job.verbose > 0),
        balanced=job.balanced,
        time_limit=job.time_limit,
    )
    model.fit(
        train_data,
        epochs=recipe.epochs,
        steps_per_epoch=job.train_data.steps(recipe.batch_size),
        # Keras opens a validation iterator each epoch, a second one at the end of a finite
        # dataset's pass; repeated and read for its steps, one (`fit_dataset` says why).
        validation_data=test.repeat(),
        validation_steps=job.test_data.steps(recipe.batch_size, training=False),
        callbacks=[counter.callback(), *job.callbacks(hardening)],
        shuffle=False,  # the order is the dataset's, a function of (seed, epoch)
        class_weight=None if job.class_weights is None else dict(enumerate(job.class_weights)),
        verbose=job.verbose,
    )
    return loop_report(hardening.report, lambda: evaluate_accuracy(model, test))
