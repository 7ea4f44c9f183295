"""The tf.data pipeline: seeded epoch order, per-example augmentation seeds, batching.

Every training pipeline is a pure function of `(seed, epoch, example)`: the epoch's order
is drawn from `(seed, epoch)` and each example's augmentation is seeded with `(seed,
epoch, example index)`, so a run resumed at an epoch boundary sees exactly the batches of
an uninterrupted one. `EpochData.fit_dataset()` gives `model.fit` one endless dataset whose
first epoch is read from an `EpochCounter` when Keras opens its iterator.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from keras_autoshuffle import _validation

if TYPE_CHECKING:
    import keras
    import tensorflow_datasets as tfds


def example_seed(
    seed: int | tf.Tensor, epoch: int | tf.Tensor, index: int | tf.Tensor
) -> tf.Tensor:
    """The stateless seed (shape [2]) of one example in one epoch."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.constant(0x5EED, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))


def epoch_permutation(
    num_examples: int, seed: int | tf.Tensor, epoch: int | tf.Tensor
) -> tf.Tensor:
    """The order of the examples in `epoch`: a permutation drawn from `(seed, epoch)`."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.argsort(tf.random.stateless_uniform([num_examples], seed=key))


class EpochCounter:
    """A variable holding the current epoch, set by `callback()` at each epoch's start."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_epoch")

    def callback(self) -> "keras.callbacks.Callback":
        """A Keras callback that sets the variable to the epoch at each epoch's start."""
        import keras

        counter = self

        class _SetEpoch(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                counter.variable.assign(epoch)

        return _SetEpoch()


class EpochData:
    """A data split whose epoch `e` is a pure function of `(seed, e)`.

    Subclasses implement `num_examples` and `_examples(epoch, training, prepare)`: a
    dataset of `prepare(image, label, index)` in the epoch's order, `prepare` called in
    the same parallel map that reads the example (one map per example: each tf.data map
    adds its own per-element cost and, each epoch, its function's instantiation and
    optimisation); `prepare` augments (training only), this class batches, shards and
    prefetches.
    """

    num_classes = None
    input_shape = None

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    @property
    def num_examples(self) -> int:
        raise NotImplementedError

    def steps(self, batch_size: int, training: bool = True) -> int:
        """Batches per epoch: training drops the last partial batch, evaluation keeps it."""
        if training:
            return self.num_examples // batch_size
        return -(-self.num_examples // batch_size)

    def check_batch_size(self, batch_size: int, training: bool = True) -> None:
        """ValueError naming `batch_size` unless it is a positive integer, in training at
        most the examples (a full batch per epoch)."""
        _validation.positive_int(batch_size, "batch_size")
        if training and batch_size > self.num_examples:
            raise ValueError(
                f"`batch_size` must be at most the {self.num_examples} training examples "
                f"(no full batch per epoch). Received: batch_size={batch_size}"
            )

    def epoch_dataset(
        self,
        epoch: int | tf.Tensor,
        batch_size: int,
        training: bool = True,
        num_shards: int = 1,
        shard_index: int = 0,
    ) -> tf.data.Dataset:
        """The batches of one epoch; `epoch` may be a Python int or a scalar tensor.

        With `num_shards > 1` (one shard per worker) `batch_size` is the per-shard batch:
        step k of shard w holds the batch `k * num_shards + w`, so the shards' batches of
        one step together are the global batch of a single-worker run.
        """
        self.check_batch_size(batch_size, training)

        def prepare(image, label, index):
            if training:
                image = self._augment(image, example_seed(self.seed, epoch, index))
            return image, label

        data = self._examples(epoch, training, prepare)
        data = data.batch(batch_size, drop_remainder=training)
        if num_shards > 1:
            data = data.shard(num_shards, shard_index)
        return data.prefetch(tf.data.AUTOTUNE)

    def fit_dataset(self, batch_size: int, counter: EpochCounter) -> tf.data.Dataset:
        """An endless dataset for `model.fit`: epoch after epoch, from the epoch
        `counter.variable` holds when Keras opens its iterator.

        Pass `counter.callback()` and `steps_per_epoch=self.steps(batch_size)` to `fit`
        (without it the first epoch never ends): Keras then opens one iterator, after the
        first epoch's `on_epoch_begin` (a resumed run's first epoch), and reads every epoch
        from it. A dataset of one epoch costs two iterators an epoch (Keras opens the next
        one at an epoch's end, then another at the next epoch's start), each instantiating
        the pipeline's functions again (docs/lab-notes/training.md, "Iterators per fit").
        """
        self.check_batch_size(batch_size)
        first = tf.data.Dataset.from_tensors(0).map(lambda _: counter.variable.read_value())
        epochs = first.flat_map(lambda epoch: tf.data.Dataset.range(epoch, tf.int64.max))
        data = epochs.flat_map(lambda epoch: self.epoch_dataset(epoch, batch_size))
        return data.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))

    def eval_dataset(self, batch_size: int) -> tf.data.Dataset:
        """The evaluation batches: fixed order, no augmentation, last partial batch kept."""
        return self.epoch_dataset(0, batch_size, training=False)

    def _order(self, epoch, training):
        """The example indices of an epoch: `epoch_permutation`'s in training, else 0..n-1."""
        if training:
            order = epoch_permutation(self.num_examples, self.seed, epoch)
        else:
            order = tf.range(self.num_examples)
        return tf.data.Dataset.from_tensor_slices(tf.cast(order, tf.int64))

    def _augment(self, image, seed):
        return image


class ArrayData(EpochData):
    """An in-memory split (digits, Fashion-MNIST, CIFAR-10): a global permutation per epoch.

    Args:
        images: float32 array (n, height, width, channels), already normalised.
        labels: int array (n,).
        augment: `fn(image, seed) -> image` for training, or None.
        seed: the run's data seed.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        num_classes: int,
        augment: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(seed)
        images = np.asarray(images, dtype=np.float32)
        labels = np.asarray(labels, dtype=np.int32)
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                "`images` must be (n, height, width, channels) with one label each. "
                f"Received: images.shape={images.shape}, labels.shape={labels.shape}"
            )
        self.images, self.labels = images, labels
        self.num_classes = int(num_classes)
        self.input_shape = images.shape[1:]
        self.augment = augment

    @property
    def num_examples(self) -> int:
        return len(self.labels)

    def subset(self, count: int) -> "ArrayData":
        """The first `count` examples (smoke tests)."""
        data = ArrayData(
            self.images[:count], self.labels[:count], self.num_classes, self.augment, self.seed
        )
        return data

    def _examples(self, epoch, training, prepare):
        images, labels = tf.constant(self.images), tf.constant(self.labels)
        return self._order(epoch, training).map(
            lambda i: prepare(tf.gather(images, i), tf.gather(labels, i), i),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    def _augment(self, image, seed):
        return image if self.augment is None else self.augment(image, seed)


class TFDSData(EpochData):
    """A streamed TFDS split (ImageNet): fixed file order, a shuffle buffer seeded per epoch.

    Args:
        builder: a prepared `tfds` builder.
        split: the split name.
        train_transform: `fn(jpeg_bytes, seed) -> image`, decoding and augmenting.
        eval_transform: `fn(jpeg_bytes) -> image`, decoding deterministically.
        seed: the run's data seed.
        shuffle_buffer: examples in the seeded shuffle buffer.
    """

    def __init__(
        self,
        builder: "tfds.core.DatasetBuilder",
        split: str,
        train_transform: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        eval_transform: Callable[[tf.Tensor], tf.Tensor],
        seed: int = 0,
        shuffle_buffer: int = 10_000,
    ) -> None:
        super().__init__(seed)
        self.builder, self.split = builder, split
        self.train_transform, self.eval_transform = train_transform, eval_transform
        self.shuffle_buffer = int(shuffle_buffer)
        self.num_classes = builder.info.features["label"].num_classes
        self._limit = None
        self._num = int(self._read().cardinality())
        if self._num < 0:
            self._num = builder.info.splits[split].num_examples

    @property
    def num_examples(self) -> int:
        return self._num

    def subset(self, count: int) -> "TFDSData":
        """The first `count` examples (smoke tests)."""
        data = TFDSData.__new__(TFDSData)
        data.__dict__.update(self.__dict__, _limit=count, _num=min(count, self._num))
        return data

    def _read(self):
        import tensorflow_datasets as tfds

        # Images stay JPEG bytes until the transform: a shuffle buffer of encoded images.
        data = self.builder.as_dataset(
            split=self.split,
            shuffle_files=False,
            read_config=_deterministic_read_config(),
            decoders={"image": tfds.decode.SkipDecoding()},
        )
        return data if self._limit is None else data.take(self._limit)

    def _examples(self, epoch, training, prepare):
        data = self._read().enumerate().map(lambda i, ex: (ex["image"], ex["label"], i))
        if training:
            seed = tf.cast(self.seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)
            data = data.shuffle(self.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)

        def load(image, label, index):
            if not training:
                image = self.eval_transform(image)
            return prepare(image, label, index)

        return data.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _augment(self, image, seed):
        return self.train_transform(image, seed)


def _deterministic_read_config():
    import tensorflow_datasets as tfds

    options = tf.data.Options()
    options.deterministic = True
    return tfds.ReadConfig(options=options, interleave_cycle_length=1)
