"""Training loops: `train()` builds, trains, hardens and exports one model.

`fit` on one host (one device or MirroredStrategy); a custom step under
MultiWorkerMirroredStrategy. Both harden through `hardening.harden_and_evaluate` and
write the same report.
"""

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_autoshuffle import _validation
from keras_autoshuffle.callbacks import HardenShuffles, ShufflePenaltyLogger, evaluate_accuracy
from keras_autoshuffle.data import EpochCounter
from keras_autoshuffle.hardening import harden_and_evaluate
from keras_autoshuffle.training import distribution
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    HardeningRecord,
    prepare_run_directory,
    write_json,
)
from keras_autoshuffle.training.recipes import make_optimizer

# Seconds per layer for balanced hardening (then the best balanced permutation so far).
BALANCED_TIME_LIMIT = 60


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
):
    """Trains, hardens and exports a model; writes everything into `output_dir`.

    Args:
        model_fn: builds the (uncompiled) Keras model; called under the strategy's
            scope and the dtype policy. Its outputs are class probabilities (softmax).
        train_data, test_data: `keras_autoshuffle.data.EpochData` splits.
        recipe: a `Recipe` (see `get_recipe`).
        output_dir: where `model.keras`, `saved_model/`, `model.tflite`, `report.json`,
            `history.csv`, `logs/`, `best.keras` and the `backup/` of a running job go.
            A killed run resumes from its backup when rerun with the same settings.
        strategy: a `tf.distribute.Strategy` or a name in STRATEGIES. Create a
            MultiWorkerMirroredStrategy (`make_strategy("multi-worker")`) at program
            start, before TensorFlow runs any op, and pass it here.
        mixed_precision: float16 on GPU, bfloat16 on CPU (shuffle matrices stay float32).
        jit_compile: XLA (off by default: measured 4x slower on CPU).
        seed: seeds the initial weights, the data order and the augmentation.
        export: write the SavedModel and LiteRT files (and check them against Keras).
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
        run_settings = {
            **(settings or {}),
            **dataclasses.asdict(recipe),
            "epochs": recipe.epochs,
            "model_name": model.name,
            "parameters": int(model.count_params()),
            "mixed_precision": distribution.mixed_precision_policy() if mixed_precision else False,
            "seed": seed,
            "harden_at_epoch": harden_at_epoch,
            "balanced": balanced,
            "train_examples": train_data.num_examples,
            "test_examples": test_data.num_examples,
        }
        resumed = prepare_run_directory(own_dir, run_settings, overwrite=overwrite)
        loop = _custom_loop if multi_worker else _fit
        history_path = os.path.join(own_dir, "history.csv")
        report = loop(
            model,
            optimizer,
            strategy,
            train_data,
            test_data,
            recipe,
            own_dir,
            history_path,
            resumed=resumed,
            jit_compile=jit_compile,
            verbose=verbose if chief else 0,
            extra=list(callbacks or []),
            balanced=balanced,
            harden_at_epoch=harden_at_epoch,
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
    sample = next(iter(test_data.eval_dataset(8)))[0].numpy()
    if export and chief:
        report["export"] = _export(model, own_dir, sample)
        files.update({name: entry["path"] for name, entry in report["export"].items()})
    else:
        from keras_autoshuffle.export import save_keras

        save_keras(model, files["keras"])
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
    report["time"] = time.time() - start
    write_json(report["files"]["report"], report)
    return report


def _export(model, output_dir, sample):
    """`model.keras` as trained (hardened); SavedModel and LiteRT from the folded network.

    Folding (`folding.fold_model`) removes the shuffles' GATHERs, which split LiteRT's
    XNNPACK delegate; models it does not cover (not from `applications`, channels_first)
    are exported as they are. Every file's max abs difference is against the hardened
    model.
    """
    from keras_autoshuffle import export, folding

    results = export.export_model(model, output_dir, sample, formats=("keras",))
    folded = folding.is_foldable(model)
    inference = folding.fold_model(model, name=model.name) if folded else model
    files = export.export_model(
        inference, output_dir, sample, formats=("saved_model", "litert"), reference=model
    )
    for name, entry in files.items():
        results[name] = {**entry, "folded": folded}
    return results


def _callbacks(output_dir, history_path, resumed, chief, extra, hardening=None):
    """The run's callbacks in order: logging (ShufflePenaltyLogger before the loggers),
    hardening and its record, the backup, then the user's. So the backup of the
    hardening epoch holds the hardened weights, the end-of-training hardening runs
    before the backup is deleted, and a user's callback sees each epoch backed up."""
    backup_dir = os.path.join(output_dir, BACKUP)
    callbacks = [
        ShufflePenaltyLogger(),
        keras.callbacks.ModelCheckpoint(
            os.path.join(output_dir, "best.keras"),
            monitor="val_accuracy",
            mode="max",
            save_best_only=True,
        )
        if chief
        else None,
        keras.callbacks.TensorBoard(os.path.join(output_dir, "logs"), write_graph=False),
        keras.callbacks.CSVLogger(history_path, append=resumed),
        hardening,
        None if hardening is None else HardeningRecord(backup_dir, hardening),
        keras.callbacks.BackupAndRestore(backup_dir),
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
    resumed,
    jit_compile,
    verbose,
    extra=(),
    harden_at_epoch=None,
    balanced=False,
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
            *_callbacks(output_dir, history_path, resumed, True, extra, hardening),
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


def _custom_loop(
    model,
    optimizer,
    strategy,
    train_data,
    test_data,
    recipe,
    output_dir,
    history_path,
    resumed,
    jit_compile,
    verbose,
    extra=(),
    harden_at_epoch=None,
    balanced=False,
):
    """MultiWorkerMirroredStrategy with a hand-written step (fit is broken there).

    Each step: loss averaged over the global batch plus the penalty (`model.losses`,
    scaled by 1 / replicas since gradients are summed), `optimizer.apply_gradients` (which
    applies the DoublyStochastic constraint after the update). Keras callbacks are driven
    by hand; each worker backs up to its own directory.
    """
    batch = recipe.batch_size
    steps = train_data.steps(batch)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    with strategy.scope():
        # compile() only records the optimizer and loss here (callbacks read them).
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        optimizer.build(model.trainable_variables)

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            per_example = loss_fn(labels, probs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return _sums(per_example, probs, labels)

    def eval_fn(images, labels):
        probs = model(images, training=False)
        return _sums(loss_fn(labels, probs), probs, labels)

    @tf.function(jit_compile=False)
    def train_step(iterator):
        results = strategy.run(tf.function(step_fn, jit_compile=jit_compile), next(iterator))
        return [strategy.reduce("SUM", r, axis=None) for r in results]

    def evaluate():
        # A fresh tf.function each time: hardening changes the graph.
        @tf.function
        def eval_step(images, labels):
            results = strategy.run(eval_fn, (images, labels))
            return [strategy.reduce("SUM", r, axis=None) for r in results]

        data = strategy.experimental_distribute_dataset(test_data.eval_dataset(batch))
        totals = np.zeros(3)
        for images, labels in data:
            totals += [float(t) for t in eval_step(images, labels)]
        return totals[0] / totals[2], totals[1] / totals[2]

    statistics = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]

    @tf.function
    def mean_statistics():
        def fn():
            context = tf.distribute.get_replica_context()
            return [context.all_reduce("MEAN", v.value.read_value()) for v in statistics]

        return strategy.run(fn)

    def average_statistics():
        # BatchNorm moving statistics are updated per replica; average them over all
        # replicas so every worker evaluates and checkpoints the same model.
        for variable, mean in zip(statistics, mean_statistics(), strict=True):
            variable.assign(strategy.experimental_local_results(mean)[0])

    def epoch_data(epoch):
        def fn(context):
            return train_data.epoch_dataset(
                epoch,
                context.get_per_replica_batch_size(batch),
                num_shards=context.num_input_pipelines,
                shard_index=context.input_pipeline_id,
            )

        return strategy.distribute_datasets_from_function(fn)

    callbacks = keras.callbacks.CallbackList(
        _callbacks(output_dir, history_path, resumed, distribution.is_chief(strategy), extra),
        add_progbar=verbose > 0,
        model=model,
        verbose=verbose,
        epochs=recipe.epochs,
        steps=steps,
    )
    callbacks.on_train_begin()
    # BackupAndRestore's restored epoch (the attribute fit itself reads).
    initial_epoch = getattr(model, "_initial_epoch", None) or 0
    logs = {}
    for epoch in range(initial_epoch, recipe.epochs):
        callbacks.on_epoch_begin(epoch)
        iterator = iter(epoch_data(epoch))
        totals = np.zeros(3)
        for step in range(steps):
            callbacks.on_train_batch_begin(step)
            totals += [float(t) for t in train_step(iterator)]
            logs = {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}
            callbacks.on_train_batch_end(step, logs)
        if statistics:
            average_statistics()
        val_loss, val_accuracy = evaluate()
        logs = {**logs, "val_loss": val_loss, "val_accuracy": val_accuracy}
        logs["learning_rate"] = float(optimizer.learning_rate)
        callbacks.on_epoch_end(epoch, logs)
    # Harden before the backup is deleted: a run killed during a long hardening
    # restarts after its last epoch, not from scratch.
    report = harden_and_evaluate(model, evaluate, balanced=balanced, time_limit=BALANCED_TIME_LIMIT)
    callbacks.on_train_end(logs)
    report["final_accuracy"] = report["rounded_accuracy"]
    return report


def _sums(per_example, probs, labels):
    correct = ops.cast(ops.equal(ops.argmax(probs, axis=-1), ops.cast(labels, "int32")), "float32")
    count = ops.cast(ops.shape(labels)[0], "float32")
    return ops.sum(ops.cast(per_example, "float32")), ops.sum(correct), count
