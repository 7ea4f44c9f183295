"""Input pipelines: TFDS CIFAR-10 and ImageNet, Fashion-MNIST IDX files, embedded digits.

Every training pipeline is a pure function of `(seed, epoch, example)`: the epoch's
order is a permutation drawn from `(seed, epoch)` (or a shuffle buffer seeded with
them), and each example's augmentation uses stateless random ops seeded with
`(seed, epoch, example index)`. So a run resumed at an epoch boundary
(`keras.callbacks.BackupAndRestore`) sees exactly the batches an uninterrupted run
sees, and ends with the same weights.

`EpochData.fit_dataset()` gives `model.fit` one dataset whose epoch is read from an
`EpochCounter` variable when Keras opens the epoch's iterator (after
`on_epoch_begin`); `EpochData.epoch_dataset(epoch)` builds one epoch directly (custom
training loops, evaluation).
"""

import gzip
import os
import zlib

import numpy as np
import tensorflow as tf

# Per-channel statistics of the training images (RGB, images scaled to [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Fashion-MNIST: mean and std of the 60,000 training images' pixels scaled to [0, 1]
# (computed from the original IDX files: 0.28604, 0.35302; the test set's are 0.28685,
# 0.35244). Fixed constants, like CIFAR-10's: every split and subset is scaled alike.
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)

DATASETS = ("digits", "fashion_mnist", "cifar10", "imagenet2012")

# Where Debian's `dataset-fashion-mnist` package installs the original IDX files.
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


class DataMissingError(ValueError):
    """The data set is not on this machine; the message says how to provide it."""


def example_seed(seed, epoch, index):
    """The stateless seed (shape [2]) of one example in one epoch."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.constant(0x5EED, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))


def epoch_permutation(num_examples, seed, epoch):
    """The order of the examples in `epoch`: a permutation drawn from `(seed, epoch)`."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.argsort(tf.random.stateless_uniform([num_examples], seed=key))


def normalize(image, mean, std):
    """Scales uint8 (or [0, 255]) images to [0, 1] and standardises each channel."""
    image = tf.cast(image, tf.float32) / 255.0
    return (image - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def pad_crop_flip(image, seed, padding=4, flip=True):
    """CIFAR augmentation: zero-pad by `padding`, random crop back, random horizontal flip."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    shape = tf.shape(image)
    padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
    image = tf.image.stateless_random_crop(padded, shape, seed=seeds[0])
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return image


def random_resized_crop(image, seed, size=224, area=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """ImageNet augmentation: Inception-style random-resized crop to `size`, random flip."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seeds[0],
        min_object_covered=0.0,
        aspect_ratio_range=ratio,
        area_range=area,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, crop_size)
    image = tf.image.resize(image, (size, size), method="bilinear")
    return tf.image.stateless_random_flip_left_right(image, seed=seeds[1])


def resize_center_crop(image, resize=256, size=224):
    """ImageNet evaluation: shorter side to `resize`, then the central `size` x `size` crop."""
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = resize / tf.reduce_min(shape)
    new = tf.cast(tf.round(shape * scale), tf.int32)
    image = tf.image.resize(image, new, method="bilinear")
    top, left = (new[0] - size) // 2, (new[1] - size) // 2
    return tf.image.crop_to_bounding_box(image, top, left, size, size)


class EpochCounter:
    """A variable holding the current epoch, set by `callback()` at each epoch's start."""

    def __init__(self):
        with tf.init_scope():
            self.variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_epoch")

    def callback(self):
        import keras

        counter = self

        class _SetEpoch(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                counter.variable.assign(epoch)

        return _SetEpoch()


class EpochData:
    """A data split whose epoch `e` is a pure function of `(seed, e)`.

    Subclasses implement `num_examples` and `_examples(epoch, training)`: a dataset of
    `(image, label, index)` in the epoch's order; this class augments (training only),
    batches, shards and prefetches.
    """

    num_classes = None
    input_shape = None

    def __init__(self, seed=0):
        self.seed = int(seed)

    @property
    def num_examples(self):
        raise NotImplementedError

    def steps(self, batch_size, training=True):
        """Batches per epoch: training drops the last partial batch, evaluation keeps it."""
        if training:
            return self.num_examples // batch_size
        return -(-self.num_examples // batch_size)

    def _check_batch(self, batch_size, training):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size=}")
        if training and batch_size > self.num_examples:
            raise ValueError(
                f"`batch_size` exceeds the {self.num_examples} training examples. "
                f"Received: batch_size={batch_size}"
            )

    def epoch_dataset(self, epoch, batch_size, training=True, num_shards=1, shard_index=0):
        """The batches of one epoch; `epoch` may be a Python int or a scalar tensor.

        With `num_shards > 1` (one shard per worker) `batch_size` is the per-shard batch:
        step k of shard w holds the batch `k * num_shards + w`, so the shards' batches of
        one step together are the global batch of a single-worker run.
        """
        self._check_batch(batch_size, training)
        data = self._examples(epoch, training)
        if training:
            data = data.map(
                lambda image, label, index: (
                    self._augment(image, example_seed(self.seed, epoch, index)),
                    label,
                ),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        else:
            data = data.map(lambda image, label, index: (image, label))
        data = data.batch(batch_size, drop_remainder=training)
        if num_shards > 1:
            data = data.shard(num_shards, shard_index)
        return data.prefetch(tf.data.AUTOTUNE)

    def fit_dataset(self, batch_size, counter):
        """A dataset for `model.fit` whose epoch is `counter.variable` at iterator creation.

        Pass `counter.callback()` to `fit`; Keras opens a new iterator each epoch (the
        cardinality is known), after the callbacks' `on_epoch_begin`.
        """
        steps = self.steps(batch_size)
        data = tf.data.Dataset.from_tensors(0).map(lambda _: counter.variable.read_value())
        data = data.flat_map(lambda epoch: self.epoch_dataset(epoch, batch_size))
        return data.apply(tf.data.experimental.assert_cardinality(steps))

    def eval_dataset(self, batch_size):
        """The evaluation batches: fixed order, no augmentation, last partial batch kept."""
        return self.epoch_dataset(0, batch_size, training=False)

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

    def __init__(self, images, labels, num_classes, augment=None, seed=0):
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
    def num_examples(self):
        return len(self.labels)

    def subset(self, count):
        """The first `count` examples (smoke tests)."""
        data = ArrayData(
            self.images[:count], self.labels[:count], self.num_classes, self.augment, self.seed
        )
        return data

    def _examples(self, epoch, training):
        images, labels = tf.constant(self.images), tf.constant(self.labels)
        if training:
            order = epoch_permutation(self.num_examples, self.seed, epoch)
        else:
            order = tf.range(self.num_examples)
        return tf.data.Dataset.from_tensor_slices(tf.cast(order, tf.int64)).map(
            lambda i: (tf.gather(images, i), tf.gather(labels, i), i)
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
        builder,
        split,
        train_transform,
        eval_transform,
        seed=0,
        shuffle_buffer=10_000,
    ):
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
    def num_examples(self):
        return self._num

    def subset(self, count):
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

    def _examples(self, epoch, training):
        data = self._read().enumerate().map(lambda i, ex: (ex["image"], ex["label"], i))
        if not training:
            return data.map(
                lambda image, label, i: (self.eval_transform(image), label, i),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        seed = tf.cast(self.seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)
        return data.shuffle(self.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)

    def _augment(self, image, seed):
        return self.train_transform(image, seed)


def _deterministic_read_config():
    import tensorflow_datasets as tfds

    options = tf.data.Options()
    options.deterministic = True
    return tfds.ReadConfig(options=options, interleave_cycle_length=1)


def _split_digits(test_fraction=0.2, split_seed=0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # 8x8, values 0..16
    return train_test_split(
        images,
        digits.target.astype(np.int32),
        test_size=test_fraction,
        stratify=digits.target,
        random_state=split_seed,
    )


def load_digits(size=32):
    """scikit-learn's 8x8 handwritten digits as `size` x `size` RGB in [0, 1].

    A fixed stratified split (80/20, `random_state=0`): 1437 training and 360 test
    images. Upsampled bilinearly; the grey level is repeated over 3 channels.

    Returns:
        `(x_train, y_train), (x_test, y_test)`, images float32 (n, size, size, 3).
    """
    try:
        x_train, x_test, y_train, y_test = _split_digits()
    except ImportError as error:
        raise DataMissingError(
            "The digits data set needs scikit-learn: pip install 'keras-autoshuffle[demo]'"
        ) from error

    def upsample(x):
        x = tf.image.resize(x[..., None], (size, size), method="bilinear")
        return np.repeat(np.clip(x.numpy(), 0.0, 1.0), 3, axis=-1)

    return (upsample(x_train), y_train), (upsample(x_test), y_test)


def digits(seed=0, augment=True):
    """The embedded digits as `(train, test)` `ArrayData`, normalised to mean 0.5, std 0.5.

    Training augmentation (when `augment`): zero-pad by 2 and random-crop back (no
    flips: a mirrored digit is another symbol).
    """
    (x_train, y_train), (x_test, y_test) = load_digits()
    x_train, x_test = (x_train - 0.5) / 0.5, (x_test - 0.5) / 0.5
    crop = (lambda image, s: pad_crop_flip(image, s, padding=2, flip=False)) if augment else None
    return (
        ArrayData(x_train, y_train, 10, augment=crop, seed=seed),
        ArrayData(x_test, y_test, 10, seed=seed),
    )


def read_idx(path, shape):
    """The uint8 array in an IDX file (gzip-compressed or not), checked against `shape`.

    `shape` gives the expected dimensions, `None` where any size is allowed (the count).
    A damaged or truncated file, a wrong magic number (not unsigned bytes with
    `len(shape)` dimensions) or unexpected dimensions raise `ValueError` naming `path`.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"Cannot read the IDX file {path}: {error}") from error
    magic = 0x800 + len(shape)  # 0x08: unsigned bytes, then the number of dimensions
    header = 4 + 4 * len(shape)
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        found = raw[:4].hex() if len(raw) >= 4 else f"{len(raw)} bytes"
        raise ValueError(
            f"{path} is not an IDX file of unsigned bytes with {len(shape)} dimensions: "
            f"expected the magic number {magic:08x}, found {found}."
        )
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", len(shape), offset=4))
    if any(want is not None and want != got for want, got in zip(shape, dims, strict=True)):
        expected = tuple("n" if d is None else d for d in shape)
        raise ValueError(f"{path} holds an array of shape {dims}; expected {expected}.")
    size = int(np.prod(dims))
    if len(raw) - header != size:
        raise ValueError(
            f"{path} is damaged or truncated: its header says {dims} = {size} bytes of "
            f"data, the file has {len(raw) - header}."
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def _fashion_mnist_dirs(data_dir=None):
    """Where the IDX files are looked for, in order."""
    if data_dir is not None:
        return (os.fspath(data_dir),)
    keras_home = os.environ.get("KERAS_HOME", os.path.join("~", ".keras"))
    keras_cache = os.path.join(os.path.expanduser(keras_home), "datasets", "fashion-mnist")
    return (FASHION_MNIST_DEBIAN_DIR, keras_cache)


def _find_fashion_mnist(data_dir=None):
    """`{name: path}` for the four IDX files, all from the first folder holding them."""
    names = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
    lacking = []
    for folder in _fashion_mnist_dirs(data_dir):
        paths, missing = {}, []
        for name in names:
            found = [
                os.path.join(folder, file)
                for file in (name, name + ".gz")
                if os.path.isfile(os.path.join(folder, file))
            ]
            if found:
                paths[name] = found[0]
            else:
                missing.append(name + "[.gz]")
        if not missing:
            return paths
        lacking.append(f"{folder} (missing {', '.join(missing)})")
    raise DataMissingError(
        f"Fashion-MNIST is not on this machine; looked in: {'; '.join(lacking)}. "
        "Install it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu, into "
        f"{FASHION_MNIST_DEBIAN_DIR}), or pass --data-dir DIR with the four IDX files "
        f"({', '.join(n + '.gz' for n in names)}, gzip-compressed or not), or, on a "
        "machine with internet, run `keras.datasets.fashion_mnist.load_data()` once "
        "(it caches them in ~/.keras/datasets/fashion-mnist)."
    )


def load_fashion_mnist(data_dir=None):
    """The original Fashion-MNIST IDX files as uint8 arrays; never downloads.

    Looks in `data_dir` only, when given; otherwise in `FASHION_MNIST_DEBIAN_DIR` (Debian's
    `dataset-fashion-mnist`), then in `$KERAS_HOME/datasets/fashion-mnist` (default
    `~/.keras`, where `keras.datasets.fashion_mnist.load_data()` caches them). Each file may
    be gzip-compressed (`NAME.gz`) or not (`NAME`).

    Returns:
        `(x_train, y_train), (x_test, y_test)`, images uint8 (n, 28, 28), labels uint8 (n,).
    """
    paths = _find_fashion_mnist(data_dir)
    splits = []
    for images_name, labels_name in FASHION_MNIST_FILES.values():
        images = read_idx(paths[images_name], (None, 28, 28))
        labels = read_idx(paths[labels_name], (None,))
        if len(images) != len(labels):
            raise ValueError(
                f"{paths[images_name]} holds {len(images)} images but "
                f"{paths[labels_name]} holds {len(labels)} labels."
            )
        if labels.size and labels.max() > 9:
            raise ValueError(
                f"{paths[labels_name]} holds the label {labels.max()}; Fashion-MNIST's are 0..9."
            )
        splits.append((images, labels))
    return tuple(splits)


def fashion_mnist(seed=0, data_dir=None, augment=True):
    """Fashion-MNIST (60,000 / 10,000 28x28 grey images, 10 classes) as `(train, test)`.

    `ArrayData` of float32 (n, 28, 28, 1), normalised with `FASHION_MNIST_MEAN` and
    `FASHION_MNIST_STD`. Training augmentation (when `augment`): zero-pad by 2, random
    crop back and random horizontal flip (a mirrored garment is the same class). Where
    the files are looked for: `load_fashion_mnist`.
    """
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(data_dir)

    def scale(images):
        images = images[..., None].astype(np.float32) / np.float32(255.0)
        mean = np.asarray(FASHION_MNIST_MEAN, np.float32)
        return (images - mean) / np.asarray(FASHION_MNIST_STD, np.float32)

    crop_flip = (lambda image, s: pad_crop_flip(image, s, padding=2)) if augment else None
    return (
        ArrayData(scale(x_train), y_train, 10, augment=crop_flip, seed=seed),
        ArrayData(scale(x_test), y_test, 10, seed=seed),
    )


def prepared_builder(name, data_dir=None, manual_dir=None, download=False):
    """A TFDS builder whose data is on disk, preparing it only when that cannot hang.

    `imagenet2012` is prepared from the archives in `manual_dir` (no network needed).
    Other data sets are downloaded only with `download=True`. Otherwise a missing data set
    raises `DataMissingError` saying how to provide it; nothing waits on the network.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
        return builder
    where = builder.data_dir
    if name == "imagenet2012":
        manual = manual_dir or os.path.join(
            data_dir or tfds.core.constants.DATA_DIR, "downloads", "manual"
        )
        archives = ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar")
        missing = [a for a in archives if not os.path.exists(os.path.join(manual, a))]
        if missing:
            raise DataMissingError(
                f"ImageNet is not prepared at {where} and the manual archives {missing} are not "
                f"in {manual}. Download them from https://image-net.org (registration needed), "
                "put them in that folder (or pass --manual-dir), and run again: TFDS prepares "
                "the data set from them once (hours, ~150 GB)."
            )
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual)
        )
        return builder
    if not download:
        raise DataMissingError(
            f"The TFDS data set {name!r} is not prepared at {where}. On a machine with "
            f"internet, run `tfds build {name} --data_dir DIR` (or this script with "
            "--download), then pass --data-dir DIR; or copy a prepared tensorflow_datasets "
            "folder here. Without a network, `--dataset digits` trains on the embedded data."
        )
    builder.download_and_prepare()
    return builder


def cifar10(seed=0, data_dir=None, download=False):
    """CIFAR-10 from TFDS as `(train, test)` `ArrayData` (held in memory, ~600 MB float32).

    Training: pad-4 random crop and horizontal flip; both splits per-channel normalised.
    """
    import tensorflow_datasets as tfds

    builder = prepared_builder("cifar10", data_dir=data_dir, download=download)
    splits = []
    for split in ("train", "test"):
        data = builder.as_dataset(split=split, shuffle_files=False, as_supervised=True)
        images, labels = zip(*tfds.as_numpy(data), strict=True)
        images = normalize(np.stack(images), CIFAR10_MEAN, CIFAR10_STD).numpy()
        splits.append((images, np.asarray(labels)))
    (x_train, y_train), (x_test, y_test) = splits
    return (
        ArrayData(x_train, y_train, 10, augment=pad_crop_flip, seed=seed),
        ArrayData(x_test, y_test, 10, seed=seed),
    )


def imagenet(seed=0, data_dir=None, manual_dir=None, size=224, shuffle_buffer=10_000):
    """ImageNet (ILSVRC 2012) from TFDS as `(train, validation)` `TFDSData`, streamed.

    Training: random-resized crop to `size` and horizontal flip; evaluation: resize 256,
    center crop `size`; both per-channel normalised.
    """
    builder = prepared_builder("imagenet2012", data_dir=data_dir, manual_dir=manual_dir)

    def decode(jpeg):
        return tf.cast(tf.io.decode_jpeg(jpeg, channels=3), tf.float32)

    def train_transform(jpeg, seed):
        image = random_resized_crop(decode(jpeg), seed, size=size)
        return normalize(image, IMAGENET_MEAN, IMAGENET_STD)

    def eval_transform(jpeg):
        image = resize_center_crop(decode(jpeg), resize=size * 256 // 224, size=size)
        return normalize(image, IMAGENET_MEAN, IMAGENET_STD)

    def make(split, shuffle=shuffle_buffer):
        data = TFDSData(builder, split, train_transform, eval_transform, seed, shuffle)
        data.input_shape = (size, size, 3)
        return data

    return make("train"), make("validation")


def load(name, seed=0, data_dir=None, manual_dir=None, download=False):
    """`(train, test)` EpochData for `name` in DATASETS."""
    if name == "digits":
        return digits(seed)
    if name == "fashion_mnist":
        return fashion_mnist(seed, data_dir)
    if name == "cifar10":
        return cifar10(seed, data_dir, download)
    if name == "imagenet2012":
        return imagenet(seed, data_dir, manual_dir)
    raise ValueError(f"`dataset` must be one of {DATASETS}. Received: dataset={name!r}")
