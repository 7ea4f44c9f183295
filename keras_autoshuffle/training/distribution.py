"""Distribution: the tf.distribute strategy of a run and the facts loops need from it.

`model.fit` on one device or under MirroredStrategy (the GPUs of one host); across hosts,
MultiWorkerMirroredStrategy driving a custom training step (Keras 3.15's `fit` is broken
under that strategy: keras-team/keras#20585).
"""

import json
import os
from collections.abc import Sequence
from typing import Literal

import tensorflow as tf

from keras_autoshuffle import _validation
from keras_autoshuffle_cli.train import STRATEGIES  # the --strategy choices, defined once


def make_strategy(
    name: Literal["auto", "one-device", "mirrored", "multi-worker"] = "auto",
) -> tf.distribute.Strategy:
    """The tf.distribute strategy for `name` in STRATEGIES.

    "auto": multi-worker when TF_CONFIG lists several workers, mirrored with several
    local GPUs, else one device. "mirrored": all local GPUs (or the local CPUs if none).
    """
    _validation.choice(name, STRATEGIES, "strategy")
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


def cpu_mirrored_strategy(devices: Sequence[str]) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over local CPU devices, reducing on one device (no collectives)."""
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def _num_workers_in_tf_config():
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = config.get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def mixed_precision_policy() -> Literal["mixed_float16", "mixed_bfloat16"]:
    """ "mixed_float16" on GPU, "mixed_bfloat16" on CPU."""
    return "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi-worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy) or (
        strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy()
    ):
        return "one-device"
    return type(strategy).__name__


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )


def task_id(strategy: tf.distribute.Strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    return 0 if resolver is None else resolver.task_id


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
