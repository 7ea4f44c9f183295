"""The data sets, one loader each: embedded digits, Fashion-MNIST IDX files, and CIFAR-10
and ImageNet via TFDS. Each returns `(train, test)` splits from `pipeline`, never downloads
unless asked, and raises `DataMissingError` saying how to provide what is missing.
"""

import functools
import gzip
import os
import zlib
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

# One definition of ImageNet's statistics, shared with `applications.preprocess_input`.
from keras_autoshuffle.applications import IMAGENET_MEAN, IMAGENET_STD  # noqa: F401
from keras_autoshuffle.data import transforms
from keras_autoshuffle.data.pipeline import ArrayData, TFDSData

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

# Per-channel statistics of the training images (RGB, images scaled to [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
"""CIFAR-10's per-channel mean (RGB, images in [0, 1])."""
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
"""CIFAR-10's per-channel standard deviation (RGB, images in [0, 1])."""
# Fashion-MNIST: mean and std of the 60,000 training images' pixels scaled to [0, 1]
# (computed from the original IDX files: 0.28604, 0.35302; the test set's are 0.28685,
# 0.35244). Fixed constants, like CIFAR-10's: every split and subset is scaled alike.
FASHION_MNIST_MEAN = (0.2860,)
"""Fashion-MNIST's pixel mean (images in [0, 1])."""
FASHION_MNIST_STD = (0.3530,)
"""Fashion-MNIST's pixel standard deviation (images in [0, 1])."""

FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
"""Where Debian's `dataset-fashion-mnist` package installs the original IDX files."""
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
"""The IDX file names of each split: {split: (images, labels)}."""


class DataMissingError(ValueError):
    """The data set is not on this machine; the message says how to provide it."""


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


def load_digits(
    size: int = 32,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
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


def digits(seed: int = 0, augment: bool = True) -> tuple[ArrayData, ArrayData]:
    """The embedded digits as `(train, test)` `ArrayData`, normalised to mean 0.5, std 0.5.

    Training augmentation (when `augment`): zero-pad by 2 and random-crop back (no
    flips: a mirrored digit is another symbol).
    """
    (x_train, y_train), (x_test, y_test) = load_digits()
    x_train, x_test = (x_train - 0.5) / 0.5, (x_test - 0.5) / 0.5
    crop = functools.partial(transforms.pad_crop_flip, padding=2, flip=False) if augment else None
    return (
        ArrayData(x_train, y_train, 10, augment=crop, seed=seed),
        ArrayData(x_test, y_test, 10, seed=seed),
    )


def read_idx(path: str | os.PathLike, shape: tuple[int | None, ...]) -> np.ndarray:
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


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
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


def fashion_mnist(
    seed: int = 0, data_dir: str | os.PathLike | None = None, augment: bool = True
) -> tuple[ArrayData, ArrayData]:
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

    crop_flip = functools.partial(transforms.pad_crop_flip, padding=2) if augment else None
    return (
        ArrayData(scale(x_train), y_train, 10, augment=crop_flip, seed=seed),
        ArrayData(scale(x_test), y_test, 10, seed=seed),
    )


def prepared_builder(
    name: str,
    data_dir: str | os.PathLike | None = None,
    manual_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> "tfds.core.DatasetBuilder":
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
            f"internet, run `tfds build {name} --data_dir DIR` (or this command with "
            "--download), then pass --data-dir DIR; or copy a prepared tensorflow_datasets "
            "folder here. Without a network, `--dataset digits` trains on the embedded data."
        )
    builder.download_and_prepare()
    return builder


def cifar10(
    seed: int = 0, data_dir: str | os.PathLike | None = None, download: bool = False
) -> tuple[ArrayData, ArrayData]:
    """CIFAR-10 from TFDS as `(train, test)` `ArrayData` (held in memory, ~600 MB float32).

    Training: pad-4 random crop and horizontal flip; both splits per-channel normalised.
    """
    import tensorflow_datasets as tfds

    builder = prepared_builder("cifar10", data_dir=data_dir, download=download)
    splits = []
    for split in ("train", "test"):
        data = builder.as_dataset(split=split, shuffle_files=False, as_supervised=True)
        images, labels = zip(*tfds.as_numpy(data), strict=True)
        images = transforms.normalize(np.stack(images), CIFAR10_MEAN, CIFAR10_STD).numpy()
        splits.append((images, np.asarray(labels)))
    (x_train, y_train), (x_test, y_test) = splits
    return (
        ArrayData(x_train, y_train, 10, augment=transforms.pad_crop_flip, seed=seed),
        ArrayData(x_test, y_test, 10, seed=seed),
    )


def imagenet(
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    manual_dir: str | os.PathLike | None = None,
    size: int = 224,
    shuffle_buffer: int = 10_000,
) -> tuple[TFDSData, TFDSData]:
    """ImageNet (ILSVRC 2012) from TFDS as `(train, validation)` `TFDSData`, streamed.

    Training: random-resized crop to `size` and horizontal flip; evaluation: the pixels of
    `applications.evaluation_preprocessing(size)` (`transforms.imagenet_evaluation`);
    both per-channel normalised.
    """
    builder = prepared_builder("imagenet2012", data_dir=data_dir, manual_dir=manual_dir)

    def decode(jpeg):
        return tf.cast(tf.io.decode_jpeg(jpeg, channels=3), tf.float32)

    def train_transform(jpeg, seed):
        return transforms.imagenet_training(decode(jpeg), seed, size)

    def eval_transform(jpeg):
        return transforms.imagenet_evaluation(decode(jpeg), size)

    def make(split, shuffle=shuffle_buffer):
        data = TFDSData(builder, split, train_transform, eval_transform, seed, shuffle)
        data.input_shape = (size, size, 3)
        return data

    return make("train"), make("validation")
