"""A folder of labelled images, for fine-tuning: scanned and checked before any training
(`image_folder_scan`), split once and recorded (`image_folder_split`), read as
`EpochData` (`ImageFolderData`).

`image_folder(root, record=path)` saves the split it scans and, when the record exists,
reads the same images again: a resumed or repeated run trains on the same split.
"""

import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import evaluation_sizes
from keras_autoshuffle.data import transforms
from keras_autoshuffle.data.image_cache import build_image_cache, read_cached
from keras_autoshuffle.data.image_folder_scan import (
    _check_root,
    _problems,
    _split_arguments,
    scan_image_folder,
)
from keras_autoshuffle.data.image_folder_split import ImageFolderError, ImageFolderSplit, _error
from keras_autoshuffle.data.images import (
    MAX_PIXELS,
    decode_rgb,
)
from keras_autoshuffle.data.pipeline import EpochData

# Training decodes a JPEG at 1/2, 1/4 or 1/8 scale when its shorter side stays at least
# TRAINING_DECODE_FACTOR * image_size: a random-resized crop (8% to 100% of the area) then
# keeps the pixels it had on the ~500 x 375 photos the ImageNet weights were trained on,
# and the DCT scaling averages blocks where the bilinear resize would skip pixels.
# Measured (experiments/finetune_throughput.py): epochs of 4000 x 3000 photos 1.9x faster.
TRAINING_DECODE_FACTOR = 2


class ImageFolderData(EpochData):
    """Images read from files, as `EpochData`: an epoch is a pure function of `(seed,
    epoch)`.

    Training: each file decoded (a large JPEG at a reduced scale, its shorter side kept
    at `decode_min_side` or more) or read from the cache (`cache_images`), then a
    random-resized crop to `image_size`, a random flip unless `flip` is False, and
    ImageNet's normalisation. Evaluation: `applications.evaluation_preprocessing(
    image_size)`'s pixels (resize the shorter side, crop the centre, normalise).

    Args:
        root: the folder the paths are relative to.
        examples: (path relative to `root` with "/" separators, label) pairs, checked
            files (`ImageFolderSplit.train` or `.val`).
        num_classes: the number of classes; labels are in [0, num_classes).
        image_size: the side of the square images made, an integer from 16 to 4096.
        flip: whether training flips images horizontally at random.
        training: whether this is a training split; a validation split (False) has
            evaluation epochs only.
        seed: the run's data seed.

    Attributes:
        labels: the examples' labels, int32.
        num_classes: as given.
        input_shape: (image_size, image_size, 3).
        resize_size: the evaluation resize's shorter side before the central crop.
        decode_min_side: `TRAINING_DECODE_FACTOR * image_size`.

    Raises:
        ValueError: an argument out of range, or a label outside [0, num_classes).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        examples: Sequence[tuple[str, int]],
        num_classes: int,
        image_size: int = 224,
        flip: bool = True,
        training: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(_validation.non_negative_int(seed, "seed"))
        self.image_size, self.resize_size = evaluation_sizes(image_size)
        self.num_classes = _validation.positive_int(num_classes, "num_classes")
        self.input_shape = (self.image_size, self.image_size, 3)
        self.decode_min_side = TRAINING_DECODE_FACTOR * self.image_size
        self.flip = _validation.boolean(flip, "flip")
        self.training = _validation.boolean(training, "training")
        self._cached = None  # (cache file, height, width) per example, by cache_images
        self.root = os.path.abspath(root)  # read later, wherever the working folder is
        self.examples = tuple((str(path), int(label)) for path, label in examples)
        if not self.examples:
            raise ValueError(f"`examples` must not be empty. Received: examples={examples!r}")
        self.labels = np.array([label for _, label in self.examples], dtype=np.int32)
        if self.labels.min() < 0 or self.labels.max() >= self.num_classes:
            raise ValueError(
                f"`examples` must have labels in [0, num_classes={self.num_classes}). "
                f"Received: labels from {self.labels.min()} to {self.labels.max()}"
            )

    @property
    def num_examples(self) -> int:
        """The number of examples."""
        return len(self.examples)

    def cache_images(self, folder: str | os.PathLike) -> None:
        """Decodes the training images once into `folder` (`data.image_cache`), each
        shrunk to a shorter side of at most `decode_min_side`; training epochs then read
        the cached pixels. A cache left by a killed run is completed, not rebuilt.

        Args:
            folder: the cache folder (created).

        Raises:
            ValueError: a validation split (training=False).
            image_cache.ImageCacheError: `folder` is a file, or the disk lacks room.
        """
        if not self.training:
            raise ValueError(
                "Only training images are cached (evaluation decodes the files). "
                "Received: training=False"
            )
        paths = [self.path(i) for i in range(self.num_examples)]
        self._cached = build_image_cache(paths, folder, self.decode_min_side)

    @property
    def cached(self) -> bool:
        """Whether training epochs read cached pixels (`cache_images`)."""
        return self._cached is not None

    def path(self, index: int) -> str:
        """The file of example `index` (an index into `examples`), as an absolute path."""
        return os.path.join(self.root, *self.examples[index][0].split("/"))

    def subset(self, count: int) -> "ImageFolderData":
        """The first `count` examples (a positive integer), with the same settings."""
        count = _validation.positive_int(count, "count")
        subset = ImageFolderData(
            self.root,
            self.examples[:count],
            self.num_classes,
            self.image_size,
            self.flip,
            self.training,
            self.seed,
        )
        subset._cached = None if self._cached is None else self._cached[:count]
        return subset

    def _examples(self, epoch, training, prepare):
        if training and not self.training:
            raise ValueError(
                "This is a validation split (training=False): it has evaluation epochs "
                "only. Use eval_dataset, or epoch_dataset(..., training=False). "
                "Received: training=True"
            )
        paths = tf.constant([self.path(i) for i in range(self.num_examples)])
        labels = tf.constant(self.labels)

        if training and self._cached is not None:
            files = tf.constant([file for file, _, _ in self._cached])
            shapes = tf.constant([[h, w] for _, h, w in self._cached], tf.int32)

        def load(index):
            if training and self._cached is not None:
                contents = tf.io.read_file(tf.gather(files, index))
                image = read_cached(contents, tf.gather(shapes, index))
                return prepare(image, tf.gather(labels, index), index)
            contents = tf.io.read_file(tf.gather(paths, index))
            # Evaluation: the full image, for evaluation_preprocessing's exact pixels.
            image = decode_rgb(contents, self.decode_min_side if training else None)
            if not training:
                image = transforms.imagenet_evaluation(image, self.image_size, self.resize_size)
            return prepare(image, tf.gather(labels, index), index)

        order = self._order(epoch, training)
        return order.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _augment(self, image, seed):
        return transforms.imagenet_training(image, seed, self.image_size, self.flip)


def image_folder(
    root: str | os.PathLike,
    *,
    image_size: int = 224,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    seed: int = 0,
    flip: bool = True,
    skip_damaged: bool = False,
    record: str | os.PathLike | None = None,
) -> tuple[ImageFolderData, ImageFolderData, ImageFolderSplit]:
    """A folder of labelled images as training and validation `ImageFolderData`,
    scanned and split by `scan_image_folder`. With `record` (a JSON file), the split is
    saved there; when that file exists it is read instead, each file it lists checked
    again: a resumed or repeated run uses the same images.

    Args:
        root: the folder (see `scan_image_folder` for the layouts).
        image_size: the side of the square images the model takes, 16 to 4096.
        val_fraction: the fraction of each class for validation, in (0, 1).
        split_seed: the seed of the split.
        seed: the run's data seed (epoch order and augmentation).
        flip: whether training flips images horizontally at random.
        skip_damaged: skip the files that cannot be used instead of refusing the folder.
        record: the split's JSON file, or None not to record it.

    Returns:
        (training data, validation data, the split).

    Raises:
        ImageFolderError: as `scan_image_folder`; a record that cannot be read, was made
            with another `val_fraction` or `split_seed`, or lists files now missing or
            changed (named).
        ValueError: an argument out of range, or `root` not a path.
    """
    evaluation_sizes(image_size)  # refuse bad arguments before a long scan
    val_fraction, split_seed = _split_arguments(val_fraction, split_seed)
    root = _check_root(root)
    if record is not None and os.path.exists(record):
        split = ImageFolderSplit.load(record, root)
        _check_record(split, record, val_fraction, split_seed)
    else:
        split = scan_image_folder(
            root, val_fraction=val_fraction, split_seed=split_seed, skip_damaged=skip_damaged
        )
        if record is not None:
            split.save(record)
    made = [
        ImageFolderData(
            split.root, examples, len(split.class_names), image_size, flip, training, seed
        )
        for examples, training in ((split.train, True), (split.val, False))
    ]
    return made[0], made[1], split


def _check_record(split, record, val_fraction, split_seed):
    """The record was made with these arguments, and its files are all still usable."""
    if split.source == "split" and (split.val_fraction, split.split_seed) != (
        val_fraction,
        split_seed,
    ):
        raise ImageFolderError(
            f"The split record {os.fspath(record)!r} was made with val_fraction="
            f"{split.val_fraction} and split_seed={split.split_seed}. Pass those, or use a "
            "new output folder to split the images again. Received: "
            f"val_fraction={val_fraction}, split_seed={split_seed}"
        )
    paths = [path for path, _ in split.train + split.val]
    problems = _problems([os.path.join(split.root, *p.split("/")) for p in paths], MAX_PIXELS)
    bad = [f"{path} ({problem})" for path, problem in zip(paths, problems, strict=True) if problem]
    if bad:
        listed = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise _error(
            f"{len(bad)} of the files the split record {os.fspath(record)!r} lists are "
            f"missing or changed: {listed}",
            "Restore them, or use a new output folder to scan the images again.",
            "root",
            split.root,
        )
