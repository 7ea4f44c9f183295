"""Per-image preprocessing and augmentation, applied one example at a time.

The random ones take a stateless seed (shape [2], from `pipeline.example_seed`), so an
example's augmentation depends only on `(seed, epoch, example index)`.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_autoshuffle._resize_crop import tf_resize_center_crop
from keras_autoshuffle.applications import IMAGENET_MEAN, IMAGENET_STD, evaluation_sizes


def normalize(
    image: tf.Tensor, mean: float | Sequence[float], std: float | Sequence[float]
) -> tf.Tensor:
    """Scales uint8 (or [0, 255]) images to [0, 1] and standardises each channel:
    `(image / 255 - mean) / std`, computed as `image * scale - offset` (the same within
    float32 rounding)."""
    image = tf.cast(image, tf.float32)
    std = np.asarray(std, np.float32)
    scale, offset = np.broadcast_arrays(1 / (255 * std), np.asarray(mean, np.float32) / std)
    if scale.size == 1:
        return image * scale.reshape(()) - offset.reshape(())
    channels = image.shape[-1]
    if channels is not None and channels != scale.size:
        if channels != 1:
            raise ValueError(
                f"`image` has {channels} channels and `mean`/`std` {scale.size}. Received: "
                f"image.shape={tuple(image.shape)}, mean={mean!r}, std={std!r}"
            )
        # One channel against per-channel constants: broadcast to one image per channel.
        return image * scale - offset
    # Per channel, the constants repeated along a row of pixels (width x channels):
    # TensorFlow's CPU broadcast of a (channels,) constant is ~5x slower (1.1 ms for a
    # 224 x 224 image, 0.2 ms this way), the training pipeline's largest per-image cost.
    shape = tf.shape(image)
    rows = tf.reshape(image, tf.concat([shape[:-2], [-1]], axis=0))
    rows = rows * tf.tile(scale, shape[-2:-1]) - tf.tile(offset, shape[-2:-1])
    normalized = tf.reshape(rows, shape)
    normalized.set_shape(image.shape)
    return normalized


def pad_crop_flip(
    image: tf.Tensor, seed: tf.Tensor, padding: int = 4, flip: bool = True
) -> tf.Tensor:
    """CIFAR augmentation: zero-pad by `padding`, random crop back, random horizontal flip."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    shape = tf.shape(image)
    padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
    image = tf.image.stateless_random_crop(padded, shape, seed=seeds[0])
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return image


def random_resized_crop(
    image: tf.Tensor,
    seed: tf.Tensor,
    size: int = 224,
    area: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
) -> tf.Tensor:
    """ImageNet augmentation: Inception-style random-resized crop to `size`, then a random
    horizontal flip unless `flip` is False.

    Args:
        image: one image (height, width, channels).
        seed: a stateless seed, shape [2] (`pipeline.example_seed`).
        size: the side of the square output.
        area: the range of the crop's area, as fractions of the image's.
        ratio: the range of the crop's width / height.
        flip: False for images whose mirror image is another thing (text, digits); the
            crop is the same either way.

    Returns:
        The float32 image (size, size, channels).
    """
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
    # Cast first: the same pixels (resize computes in float32), faster than from uint8.
    image = tf.cast(tf.slice(image, begin, crop_size), tf.float32)
    image = tf.image.resize(image, (size, size), method="bilinear")
    if not flip:
        return image
    return tf.image.stateless_random_flip_left_right(image, seed=seeds[1])


def resize_center_crop(image: tf.Tensor, resize: int = 256, size: int = 224) -> tf.Tensor:
    """ImageNet evaluation, torchvision's `Resize(resize)` then `CenterCrop(size)`: the
    shorter side to `resize` (the longer to `int(resize * long / short)`, bilinear,
    antialiased), then the central `size` x `size` crop, its offset rounded as
    torchvision's. The same pixels as `applications.ResizeCenterCrop(resize, size)`."""
    return tf_resize_center_crop(tf.cast(image, tf.float32), resize, size)


def imagenet_evaluation(image: tf.Tensor, size: int = 224, resize: int | None = None) -> tf.Tensor:
    """One image's ImageNet evaluation in a `tf.data` map: `resize_center_crop` then
    ImageNet's normalisation, the pixels of `applications.evaluation_preprocessing(size,
    resize)` (`resize` default `round(size * 256 / 224)`, checked as there)."""
    size, resize = evaluation_sizes(size, resize)
    return normalize(resize_center_crop(image, resize, size), IMAGENET_MEAN, IMAGENET_STD)


def imagenet_training(image: tf.Tensor, seed: tf.Tensor, size: int = 224, flip: bool = True):
    """One image's ImageNet training augmentation: `random_resized_crop` (flipped at random
    unless `flip` is False), then ImageNet's normalisation."""
    image = random_resized_crop(image, seed, size=size, flip=flip)
    return normalize(image, IMAGENET_MEAN, IMAGENET_STD)
