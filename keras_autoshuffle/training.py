"""Training recipes: the paper's hyper-parameters, strategies, callbacks, and `train()`.

`train()` runs the package's main job: build the model under a distribution strategy,
train it with SGD + momentum, a linear learning-rate decay per cycle and coupled L2
weight decay, with fault tolerance (BackupAndRestore, data that is a pure function of
(seed, epoch, example)), logs (CSV, TensorBoard, `shuffle_penalty`) and a best-model
checkpoint; then harden the shuffles (relaxed vs rounded accuracy), export `.keras`,
SavedModel and LiteRT, and write `report.json`.

Scale-out: `model.fit` on one device or under MirroredStrategy (the GPUs of one host);
across hosts, MultiWorkerMirroredStrategy driving a custom training step (Keras 3.15's
`fit` is broken under that strategy: keras-team/keras#20585).

Reference:
    Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Section 4)
"""

import dataclasses
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_autoshuffle.callbacks import HardenShuffles, ShufflePenaltyLogger, harden_model
from keras_autoshuffle.data import EpochCounter
from keras_autoshuffle.layers import relaxed_shuffles
from keras_autoshuffle.optimizers import CoupledSGD, LinearCycles, _check_positive_int

STRATEGIES = ("auto", "one-device", "mirrored", "multi-worker")
# Seconds per layer for balanced hardening's mixed-integer fallback (best permutation so far).
BALANCED_TIME_LIMIT = 60


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe.

    Args:
        penalty: lambda, the weight of the l1-2 penalty (models are built with it).
        learning_rates: the initial learning rate of each cycle; each decays linearly
            to 0 over its cycle; cycle c + 1 starts from cycle c's weights.
        cycle_epochs: epochs per cycle.
        momentum: SGD momentum.
        weight_decay: coupled L2 (PyTorch's `SGD(weight_decay=...)`), shuffle matrices excluded.
        batch_size: the global batch size (split over replicas and workers).
    """

    penalty: float
    learning_rates: tuple
    cycle_epochs: tuple
    momentum: float
    weight_decay: float
    batch_size: int
    description: str = ""

    @property
    def epochs(self):
        return int(sum(self.cycle_epochs))


RECIPES = {
    # Paper Section 4: 200 epochs, lr 0.2 linear decay, momentum 0.95, wd 1e-4, batch 128.
    "cifar10": Recipe(1e-3, (0.2,), (200,), 0.95, 1e-4, 128, "the paper's CIFAR-10 recipe"),
    # Paper Section 4: two cycles of 100 epochs (lr 0.2, then 0.1 from cycle 1's weights),
    # momentum 0.9, wd 4e-5, batch 512 (4 GPUs).
    "imagenet": Recipe(2e-3, (0.2, 0.1), (100, 100), 0.9, 4e-5, 512, "the paper's ImageNet recipe"),
    # Quick start on the embedded digits (a few minutes on 2 CPU cores). lambda = 5e-2, not
    # 1e-3: the penalty's push scales with lambda x the summed learning rate x steps, and
    # 10 short epochs at 1e-3 leave the matrices far from permutations (rounding -> chance).
    "digits": Recipe(5e-2, (0.1,), (10,), 0.9, 1e-4, 64, "quick digits preset"),
}


def get_recipe(name, epochs=None, batch_size=None, penalty=None, learning_rate=None):
    """A preset from RECIPES with optional overrides.

    Args:
        name: a key of RECIPES.
        epochs: epochs per cycle (every cycle gets this many).
        batch_size: global batch size.
        penalty: lambda.
        learning_rate: the first cycle's learning rate (later cycles keep their ratio).
    """
    if name not in RECIPES:
        raise ValueError(f"`recipe` must be one of {sorted(RECIPES)}. Received: recipe={name!r}")
    recipe = RECIPES[name]
    changes = {}
    if epochs is not None:
        _check_positive_int(epochs, "epochs")
        changes["cycle_epochs"] = (epochs,) * len(recipe.cycle_epochs)
    if batch_size is not None:
        _check_positive_int(batch_size, "batch_size")
        changes["batch_size"] = batch_size
    if penalty is not None:
        if not penalty >= 0:
            raise ValueError(f"`penalty` must be >= 0. Received: penalty={penalty}")
        changes["penalty"] = float(penalty)
    if learning_rate is not None:
        if not learning_rate > 0:
            raise ValueError(
                f"`learning_rate` must be > 0. Received: learning_rate={learning_rate}"
            )
        scale = learning_rate / recipe.learning_rates[0]
        changes["learning_rates"] = tuple(lr * scale for lr in recipe.learning_rates)
    return dataclasses.replace(recipe, **changes)


def make_optimizer(recipe, steps_per_epoch, model):
    """CoupledSGD over LinearCycles; the shuffle matrices are excluded from the L2 decay.

    Why not decay M: the constraint renormalises every row and column to sum 1, so a
    decay cannot shrink M; over doubly stochastic matrices ||M||^2 is smallest at the
    uniform matrix and largest at permutations, so an L2 pull works against the penalty.
    """
    schedule = LinearCycles(
        recipe.learning_rates, [e * steps_per_epoch for e in recipe.cycle_epochs]
    )
    optimizer = CoupledSGD(schedule, momentum=recipe.momentum, l2=recipe.weight_decay)
    optimizer.exclude_from_weight_decay(var_list=[s.matrix for s in relaxed_shuffles(model)])
    return optimizer


def make_strategy(name="auto"):
    """The tf.distribute strategy for `name` in STRATEGIES.

    "auto": multi-worker when TF_CONFIG lists several workers, mirrored with several
    local GPUs, else one device. "mirrored": all local GPUs (or the local CPUs if none).
    """
    if name not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {STRATEGIES}. Received: strategy={name!r}")
    if name == "auto" and _num_workers_in_tf_config() > 1:
        name = "multi-worker"
    if name == "multi-worker":
        # Before anything touches the TF context: collectives are configured at startup.
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else "one-device"
    if name == "one-device":
        # The default strategy: TF places ops on the first GPU, if any. A
        # OneDeviceStrategy would distribute every dataset (measured: 0.2-0.3 s per
        # iterator on CPU, a fifth of a 10-epoch digits run).
        return tf.distribute.get_strategy()
    if gpus:
        return tf.distribute.MirroredStrategy()
    # Local CPUs: reduce on one device. Collective all-reduce across logical CPUs of one
    # process reuses instance keys between strategies (a second MirroredStrategy failed
    # with "Shape mismatch in the collective instance").
    return cpu_mirrored_strategy([d.name for d in tf.config.list_logical_devices("CPU")])


def cpu_mirrored_strategy(devices):
    """MirroredStrategy over local CPU devices, reducing on one device (no collectives)."""
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def _num_workers_in_tf_config():
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = config.get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def mixed_precision_policy():
    """ "mixed_float16" on GPU, "mixed_bfloat16" on CPU."""
    return "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"


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
        strategy: a `tf.distribute.Strategy` or a name in STRATEGIES. Create a
            MultiWorkerMirroredStrategy (`make_strategy("multi-worker")`) at program
            start, before TensorFlow runs any op, and pass it here.
        mixed_precision: float16 on GPU, bfloat16 on CPU (shuffle matrices stay float32).
        jit_compile: XLA (off by default: measured 4x slower on CPU).
        seed: seeds the initial weights, the data order and the augmentation.
        export: write the SavedModel and LiteRT files (and check them against Keras).
        settings: extra entries for the report's `settings`.
        callbacks: extra Keras callbacks, run after the built-in ones (before hardening).
        harden_at_epoch: harden after this many epochs and fine-tune the rest of the
            network with the permutations fixed (`HardenShuffles(at_epoch=...)`); default:
            harden at the end (the paper). Not with the multi-worker strategy.
        balanced: balanced hardening (`harden_model(balanced=True)`): permutations that
            fold into a network as cheap as the manual one; best with `harden_at_epoch`,
            since the constrained rounding costs accuracy that fine-tuning recovers.
        verbose: 0 silent, 1 Keras's progress bar, 2 one line per epoch.

    Returns:
        The report dict (also written to `report.json`).
    """
    start = time.time()
    strategy = make_strategy(strategy) if isinstance(strategy, str) else strategy
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if harden_at_epoch is not None and multi_worker:
        raise ValueError(
            "`harden_at_epoch` works with fit (one host), not the multi-worker loop. "
            f"Received: harden_at_epoch={harden_at_epoch}"
        )
    if harden_at_epoch is not None and not 1 <= harden_at_epoch < recipe.epochs:
        raise ValueError(
            f"`harden_at_epoch` must be in [1, {recipe.epochs - 1}] (epochs={recipe.epochs}). "
            f"Received: harden_at_epoch={harden_at_epoch}"
        )
    if not isinstance(balanced, bool):
        raise ValueError(f"`balanced` must be True or False. Received: balanced={balanced!r}")
    if recipe.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f"The global batch size must divide by the {strategy.num_replicas_in_sync} "
            f"replicas. Received: batch_size={recipe.batch_size}"
        )
    chief = _is_chief(strategy)
    own_dir = output_dir if chief else os.path.join(output_dir, f"worker-{_task_id(strategy)}")
    os.makedirs(own_dir, exist_ok=True)
    previous_policy = keras.config.dtype_policy()
    if mixed_precision:
        keras.config.set_dtype_policy(mixed_precision_policy())
    try:
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            model = model_fn()
            steps = train_data.steps(recipe.batch_size)
            optimizer = make_optimizer(recipe, steps, model)
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
            jit_compile=jit_compile,
            verbose=verbose if chief else 0,
            extra=list(callbacks or []),
            balanced=balanced,
            **({"harden_at_epoch": harden_at_epoch} if harden_at_epoch else {}),
        )
    finally:
        keras.config.set_dtype_policy(previous_policy)

    report["layers"] = [
        {k: v for k, v in layer.items() if k != "permutation"} for layer in report["layers"]
    ]
    report["final_penalty"] = float(sum(layer["penalty"] for layer in report["layers"]))
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
        **(settings or {}),
        **dataclasses.asdict(recipe),
        "epochs": recipe.epochs,
        "strategy": _strategy_name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "mixed_precision": mixed_precision_policy() if mixed_precision else False,
        "jit_compile": jit_compile,
        "seed": seed,
        "train_examples": train_data.num_examples,
        "test_examples": test_data.num_examples,
    }
    report["time"] = time.time() - start
    with open(report["files"]["report"], "w") as f:
        json.dump(report, f, indent=2, default=_json_default)
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


def _strategy_name(strategy):
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi-worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy) or (
        strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy()
    ):
        return "one-device"
    return type(strategy).__name__


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )


def _task_id(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    return 0 if resolver is None else resolver.task_id


class _HardeningBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that survives `HardenShuffles(at_epoch=k)` mid-training.

    A hardened shuffle has no weights (its permutation is in its config), so the
    backup of a run hardened at epoch k holds fewer weights than a freshly built
    model: the plain callback cannot restore it, and the permutations would be lost.
    This one runs before the hardening in each epoch's callbacks (like the plain one)
    and writes the hardening report, permutations included, next to the weights once
    it exists. On restore: a backup from after epoch k gets the saved permutations
    applied to the fresh model first (its optimizer built beforehand, as in the run
    that wrote the backup, so the saved optimizer state fits); a backup of epoch k
    itself holds the relaxed weights the hardening saw, so it hardens them again.
    """

    def __init__(self, backup_dir, hardening):
        super().__init__(backup_dir)
        self.hardening = hardening
        self._hardening_path = os.path.join(backup_dir, "hardening.json")

    def _save_model(self):
        report = self.hardening.report
        if report is not None and not os.path.exists(self._hardening_path):
            os.makedirs(self.backup_dir, exist_ok=True)
            with open(self._hardening_path + ".tmp", "w") as f:
                json.dump(report, f, default=_json_default)
            os.replace(self._hardening_path + ".tmp", self._hardening_path)
        super()._save_model()

    def _load_model(self):
        metadata = os.path.join(self.backup_dir, "training_metadata.json")
        if not os.path.exists(metadata):
            return super()._load_model()
        with open(metadata) as f:
            backed_up_epochs = json.load(f)["epoch"]
        report = None
        if os.path.exists(self._hardening_path):
            with open(self._hardening_path) as f:
                report = json.load(f)
        if report is not None and report["epoch"] < backed_up_epochs:
            # The weights were saved hardened: the fresh model must take the same shape.
            optimizer = self.model.optimizer
            if not optimizer.built:
                with self.model.distribute_strategy.scope():
                    optimizer.build(self.model.trainable_variables)
            self._apply(report)
            super()._load_model()
            return None
        # The weights were saved relaxed (the report, if any, was written by a backup
        # killed before its weights): restore them, then harden as the run did.
        super()._load_model()
        if report is not None:
            self._apply(report)
        elif backed_up_epochs == self.hardening.at_epoch:
            self.hardening._harden(backed_up_epochs)
        return None

    def _apply(self, report):
        for entry in report["layers"]:
            self.model.get_layer(entry["name"]).harden(entry["permutation"])
        self.model.make_train_function(force=True)
        self.model.test_function = self.model.predict_function = None
        self.hardening.report = report

    def on_train_end(self, logs=None):
        # Keep the backup until `finish()`: the hardening at the end of training runs
        # later (after the user's callbacks), and a run killed during a long hardening
        # should restart after its last epoch, not from scratch.
        pass

    def finish(self):
        """Deletes the backup (BackupAndRestore's end of training); call after `fit`."""
        super().on_train_end()


def _callbacks(output_dir, history_path, resumed, chief, hardening=None):
    """Logging and fault-tolerance callbacks, ShufflePenaltyLogger before the loggers.

    With `hardening` (the run's HardenShuffles), the backup is a `_HardeningBackup`.
    """
    log_dir = os.path.join(output_dir, "logs")
    backup_dir = os.path.join(output_dir, "backup")
    return [
        ShufflePenaltyLogger(),
        keras.callbacks.BackupAndRestore(backup_dir)
        if hardening is None
        else _HardeningBackup(backup_dir, hardening),
        keras.callbacks.ModelCheckpoint(
            os.path.join(output_dir, "best.keras"),
            monitor="val_accuracy",
            mode="max",
            save_best_only=True,
        )
        if chief
        else None,
        keras.callbacks.TensorBoard(log_dir, write_graph=False),
        keras.callbacks.CSVLogger(history_path, append=resumed),
    ]


def _fit(
    model,
    optimizer,
    strategy,
    train_data,
    test_data,
    recipe,
    output_dir,
    history_path,
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
    resumed = os.path.exists(os.path.join(output_dir, "backup"))
    counter = EpochCounter()
    test = test_data.eval_dataset(recipe.batch_size)
    hardening = HardenShuffles(
        validation_data=test,
        at_epoch=harden_at_epoch,
        verbose=int(verbose > 0),
        balanced=balanced,
        time_limit=BALANCED_TIME_LIMIT,
    )
    callbacks = [
        counter.callback(),
        *_callbacks(output_dir, history_path, resumed, True, hardening=hardening),
        *extra,
        hardening,
    ]
    model.fit(
        train_data.fit_dataset(recipe.batch_size, counter),
        epochs=recipe.epochs,
        validation_data=test,
        callbacks=[c for c in callbacks if c is not None],
        shuffle=False,  # the order is the dataset's, a function of (seed, epoch)
        verbose=verbose,
    )
    next(c for c in callbacks if isinstance(c, _HardeningBackup)).finish()
    report = dict(hardening.report)
    # Hardened before the end: the net trained on, so its final accuracy is measured anew.
    report["final_accuracy"] = (
        report.get("rounded_accuracy")
        if report["epoch"] is None
        else float(model.evaluate(test, verbose=0, return_dict=True)["accuracy"])
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
    jit_compile,
    verbose,
    extra=(),
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

    resumed = os.path.exists(os.path.join(output_dir, "backup"))
    chief = _is_chief(strategy)
    callbacks = keras.callbacks.CallbackList(
        [c for c in _callbacks(output_dir, history_path, resumed, chief) if c is not None]
        + list(extra),
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
    callbacks.on_train_end(logs)
    relaxed_loss, relaxed_accuracy = evaluate()
    layers = harden_model(model, balanced=balanced, time_limit=BALANCED_TIME_LIMIT)
    rounded_loss, rounded_accuracy = evaluate()
    return {
        "epoch": None,
        "layers": layers,
        "relaxed_loss": relaxed_loss,
        "relaxed_accuracy": relaxed_accuracy,
        "rounded_loss": rounded_loss,
        "rounded_accuracy": rounded_accuracy,
        "final_accuracy": rounded_accuracy,
        "relative_change": (rounded_accuracy - relaxed_accuracy) / relaxed_accuracy
        if relaxed_accuracy
        else math.nan,
    }


def _sums(per_example, probs, labels):
    correct = ops.cast(ops.equal(ops.argmax(probs, axis=-1), ops.cast(labels, "int32")), "float32")
    count = ops.cast(ops.shape(labels)[0], "float32")
    return ops.sum(ops.cast(per_example, "float32")), ops.sum(correct), count


def format_summary(report):
    """Human-readable lines: time, accuracies, penalty and where every file is."""
    lines = [
        f"Trained in {report['time']:.1f} s ({report['settings']['epochs']} epochs, "
        f"{report['settings']['strategy']}, {report['settings']['replicas']} replicas)",
        f"  test accuracy relaxed {report['relaxed_accuracy']:.4f}, rounded "
        f"{report['rounded_accuracy']:.4f} (relative change {report['relative_change']:+.3e})",
        f"  final penalty sum P(M) = {report['final_penalty']:.4g} over "
        f"{len(report['layers'])} learned shuffles",
    ]
    if report.get("epoch"):
        lines.insert(
            2,
            f"  (hardened after epoch {report['epoch']}; final test accuracy "
            f"{report['final_accuracy']:.4f})",
        )
    for name, entry in report.get("export", {}).items():
        lines.append(f"  {name}: max |output - Keras| = {entry['max_abs_diff']:.2e}")
    lines.append("Files:")
    lines.extend(f"  {name:12s}{path}" for name, path in report["files"].items())
    return "\n".join(lines)


def add_arguments(parser, datasets, default_dataset):
    """The command-line options shared by the training scripts."""
    parser.add_argument("--dataset", choices=datasets, default=default_dataset)
    parser.add_argument("--model", choices=("v1", "v2"), default="v2", help="ShuffleNet version")
    parser.add_argument("--width", type=float, default=None, help="width multiplier")
    parser.add_argument("--groups", type=int, default=3, help="v1 group count")
    parser.add_argument("--shuffle", choices=("manual", "auto"), default="auto")
    parser.add_argument("--penalty", type=float, default=None, help="lambda (recipe default)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (per cycle)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=None, help="first cycle's lr")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto")
    parser.add_argument("--mixed-precision", action="store_true", help="fp16 GPU / bf16 CPU")
    parser.add_argument("--jit-compile", action="store_true", help="XLA (slower on CPU)")
    parser.add_argument("--data-dir", default=None, help="TFDS data directory")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-train-examples", type=int, default=None, help="use only the first N (smoke tests)"
    )
    parser.add_argument("--no-export", action="store_true", help="skip SavedModel and LiteRT")
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="balanced hardening: permutations that fold as cheaply as the manual shuffle",
    )
    parser.add_argument(
        "--harden-at-epoch",
        type=int,
        default=None,
        help="harden after this many epochs and fine-tune the rest (default: at the end)",
    )
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    return parser


def run_from_args(args, recipe_name, stem, manual_dir=None):
    """What the scripts do: load the data, build the model, `train()`, print the summary."""
    import sys

    from keras_autoshuffle import applications, data

    # First: MultiWorkerMirroredStrategy must exist before TensorFlow runs any op.
    strategy = make_strategy(args.strategy)
    recipe = get_recipe(
        recipe_name,
        epochs=args.epochs,
        batch_size=args.batch_size,
        penalty=args.penalty,
        learning_rate=args.learning_rate,
    )
    try:
        train_data, test_data = data.load(
            args.dataset, seed=args.seed, data_dir=args.data_dir, manual_dir=manual_dir
        )
    except data.DataMissingError as error:
        sys.exit(f"error: {error}")
    if args.max_train_examples:
        train_data = train_data.subset(args.max_train_examples)

    def model_fn():
        builder = applications.ShuffleNetV2 if args.model == "v2" else applications.ShuffleNetV1
        kwargs = {} if args.model == "v2" else {"groups": args.groups}
        return builder(
            width=args.width,
            input_shape=tuple(train_data.input_shape),
            classes=train_data.num_classes,
            shuffle=args.shuffle,
            penalty=recipe.penalty,
            stem=stem,
            **kwargs,
        )

    skip = ("output", "verbose", "max_train_examples", "no_export")
    report = train(
        model_fn,
        train_data,
        test_data,
        recipe,
        args.output,
        strategy=strategy,
        mixed_precision=args.mixed_precision,
        jit_compile=args.jit_compile,
        seed=args.seed,
        export=not args.no_export,
        settings={k: v for k, v in vars(args).items() if k not in skip},
        harden_at_epoch=args.harden_at_epoch,
        balanced=args.balanced,
        verbose=args.verbose,
    )
    print(format_summary(report))
    return report
