"""Training across hosts: MultiWorkerMirroredStrategy driving a hand-written step.

Keras 3.15's `fit` is broken under that strategy (keras-team/keras#20585), so each step is
written here with tf.distribute; the run's callbacks (`TrainingJob.callbacks`: the
divergence check after every step, logs, backup) are driven by hand with the logs `fit`
gives them, and the end is the same hardening and report as `fit`'s
(`job.loop_report`).
"""

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_autoshuffle._keras_internals import initial_epoch
from keras_autoshuffle.hardening import harden_and_evaluate
from keras_autoshuffle.training.job import TrainingJob, loop_report


def custom_loop(job: TrainingJob) -> dict[str, Any]:
    """MultiWorkerMirroredStrategy with a hand-written step (fit is broken there).

    Each step: loss averaged over the global batch plus the penalty (`model.losses`,
    scaled by 1 / replicas since gradients are summed), `optimizer.apply_gradients` (which
    applies the DoublyStochastic constraint after the update). Keras callbacks are driven
    by hand; each worker backs up to its own directory.

    Args:
        job: the run's `TrainingJob` (its `harden_at_epoch` must be None: the shuffles are
            hardened at the end).
    """
    model, recipe = job.model, job.recipe
    steps = job.train_data.steps(recipe.batch_size)
    with job.strategy.scope():
        # compile() only records the optimizer and loss here (callbacks read them).
        model.compile(optimizer=job.optimizer, loss="sparse_categorical_crossentropy")
        job.optimizer.build(model.trainable_variables)
    train_step = _train_step(job)
    average_statistics = _statistics_averager(model, job.strategy)

    def evaluate():
        return _evaluate(job)

    callbacks = keras.callbacks.CallbackList(
        job.callbacks(),
        add_progbar=job.verbose > 0,
        model=model,
        verbose=job.verbose,
        epochs=recipe.epochs,
        steps=steps,
    )
    callbacks.on_train_begin()
    logs = {}
    for epoch in range(initial_epoch(model), recipe.epochs):
        callbacks.on_epoch_begin(epoch)
        iterator = iter(_epoch_data(job, epoch))
        totals = np.zeros(3)
        for step in range(steps):
            callbacks.on_train_batch_begin(step)
            totals += [float(t) for t in train_step(iterator)]
            logs = {"loss": totals[0] / totals[2], "accuracy": totals[1] / totals[2]}
            callbacks.on_train_batch_end(step, logs)
        average_statistics()
        val_loss, val_accuracy = evaluate()
        logs = {**logs, "val_loss": val_loss, "val_accuracy": val_accuracy}
        logs["learning_rate"] = float(job.optimizer.learning_rate)
        callbacks.on_epoch_end(epoch, logs)
    # The backup is kept until the run's report is written: a run killed during the
    # hardening restarts after its last epoch, not from scratch.
    report = harden_and_evaluate(model, evaluate, balanced=job.balanced, time_limit=job.time_limit)
    callbacks.on_train_end(logs)
    return loop_report(report, evaluate)


_LOSS = keras.losses.SparseCategoricalCrossentropy(reduction=None)


def _train_step(job):
    """A tf.function running one step on every replica: the summed (loss, correct, count)."""
    model, optimizer, strategy = job.model, job.optimizer, job.strategy
    batch = job.recipe.batch_size

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            per_example = _LOSS(labels, probs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return _sums(per_example, probs, labels)

    @tf.function(jit_compile=False)
    def train_step(iterator):
        results = strategy.run(tf.function(step_fn, jit_compile=job.jit_compile), next(iterator))
        return [strategy.reduce("SUM", r, axis=None) for r in results]

    return train_step


def _evaluate(job):
    """(loss, accuracy) on the test split, summed over the replicas."""
    model, strategy = job.model, job.strategy

    # A fresh tf.function each time: hardening changes the graph.
    @tf.function
    def eval_step(images, labels):
        def fn(images, labels):
            probs = model(images, training=False)
            return _sums(_LOSS(labels, probs), probs, labels)

        results = strategy.run(fn, (images, labels))
        return [strategy.reduce("SUM", r, axis=None) for r in results]

    data = job.test_data.eval_dataset(job.recipe.batch_size)
    totals = np.zeros(3)
    for images, labels in strategy.experimental_distribute_dataset(data):
        totals += [float(t) for t in eval_step(images, labels)]
    return totals[0] / totals[2], totals[1] / totals[2]


def _statistics_averager(model, strategy):
    """A function averaging the BatchNorm moving statistics over all replicas (each
    updates its own), so every worker evaluates and backs up the same model."""
    statistics = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]

    @tf.function
    def mean_statistics():
        def fn():
            context = tf.distribute.get_replica_context()
            return [context.all_reduce("MEAN", v.value.read_value()) for v in statistics]

        return strategy.run(fn)

    def average():
        if statistics:
            for variable, mean in zip(statistics, mean_statistics(), strict=True):
                variable.assign(strategy.experimental_local_results(mean)[0])

    return average


def _epoch_data(job, epoch):
    """The training split of `epoch`, sharded over the input pipelines."""
    batch = job.recipe.batch_size

    def fn(context):
        return job.train_data.epoch_dataset(
            epoch,
            context.get_per_replica_batch_size(batch),
            num_shards=context.num_input_pipelines,
            shard_index=context.input_pipeline_id,
        )

    return job.strategy.distribute_datasets_from_function(fn)


def _sums(per_example, probs, labels):
    correct = ops.cast(ops.equal(ops.argmax(probs, axis=-1), ops.cast(labels, "int32")), "float32")
    count = ops.cast(ops.shape(labels)[0], "float32")
    return ops.sum(ops.cast(per_example, "float32")), ops.sum(correct), count
