"""The images the ImageNet weights expect: torchvision's evaluation transform, in one place.

torchvision evaluates its ShuffleNetV2 checkpoints with `ImageClassification`: resize the
shorter side to `resize_size` (bilinear, antialiased), crop the central `crop_size`
square, scale to [0, 1], normalise with ImageNet's mean and standard deviation.
`evaluation_layers` is that transform (`ToRGB`, `ResizeCenterCrop`, a `Rescaling` by
`x * scale + offset`); keras-hub's `hub.ShuffleNetImageConverter` is its one public
spelling, and `evaluation_preprocessing` (any size) and `imagenet_preprocessing(width)`
(a checkpoint's sizes) are the same layers as a `keras.Sequential`. `preprocess_input` is
the normalisation alone, keras.applications-style, for images already cropped.
"""

from typing import Any

import keras
import numpy as np
from keras import ops
from keras.applications import imagenet_utils

from keras_autoshuffle import _validation
from keras_autoshuffle._resize_crop import (
    check_sides,
    crop_start,
    resized_size,
    tf_check_sides,
    tf_resize_center_crop,
)
from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD, width_name
from keras_autoshuffle.applications.weights.registry import CHECKPOINTS


def _pixels(images, layer):
    """`images` as a tensor of pixel values: ValueError naming the layer unless they are a
    batch (rank 4) of integer or float values (not bools, strings or complex numbers)."""
    images = ops.convert_to_tensor(images)
    dtype = keras.backend.standardize_dtype(images.dtype)
    if not (keras.backend.is_float_dtype(dtype) or keras.backend.is_int_dtype(dtype)):
        raise ValueError(
            f"{layer} takes pixel values, integers or floats. Received: images.dtype={dtype}"
        )
    _check_rank(images.shape, layer)
    return images


def _check_rank(shape, layer):
    if len(shape) != 4:
        raise ValueError(
            f"{layer} takes a batch of images (rank 4); add a batch axis to a single image "
            f"(`image[None]`). Received: images.shape={tuple(shape)}"
        )


# Channels kept for each channel count, as PIL's convert("RGB") of modes L, LA, RGB, RGBA.
_RGB_CHANNELS = ((0, 0, 0), (0, 0, 0), (0, 1, 2), (0, 1, 2))


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ToRGB(keras.layers.Layer):
    """Images of 1 to 4 channels to RGB, as PIL's `Image.convert("RGB")` of the modes L,
    LA, RGB and RGBA (what torchvision's users do before its transforms, and
    `keras.utils.load_img` by default): gray is repeated to three channels, alpha is
    dropped (not composited over a background). RGB passes unchanged; other channel
    counts raise ValueError. Values and dtype are kept.

    Args:
        data_format: "channels_last" or "channels_first" (default: Keras's).
        **kwargs: other Layer arguments (`name`, `dtype`).

    Input: a batch of images (rank 4), integers or floats.
    """

    def __init__(self, data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_format = _validation.data_format(data_format)

    def call(self, images):
        images = _pixels(images, "ToRGB")
        axis = _validation.channel_axis(self.data_format)
        channels = images.shape[axis]
        if channels is None:  # TensorFlow, channels unknown when traced
            import tensorflow as tf

            count = tf.shape(images)[axis]
            check = tf.debugging.Assert(
                tf.logical_and(count >= 1, count <= 4),
                [_channels_message(self.data_format), tf.shape(images)],
                summarize=8,
            )
            with tf.control_dependencies([check]):
                kept = tf.gather(tf.constant(_RGB_CHANNELS), tf.clip_by_value(count, 1, 4) - 1)
            return tf.gather(images, kept, axis=axis)
        if not 1 <= channels <= 4:
            raise ValueError(_channels_message(self.data_format) + str(tuple(images.shape)))
        if channels == 3:
            return images
        return ops.take(images, list(_RGB_CHANNELS[channels - 1]), axis=axis)

    def compute_output_shape(self, input_shape):
        _check_rank(input_shape, "ToRGB")
        shape = list(input_shape)
        shape[_validation.channel_axis(self.data_format)] = 3
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


def _channels_message(data_format):
    return (
        f"ToRGB takes images of 1 (gray), 2 (gray and alpha), 3 (RGB) or 4 (RGBA) channels "
        f"({data_format}). Received: images.shape="
    )


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ResizeCenterCrop(keras.layers.Layer):
    """torchvision's `Resize(resize_size)` then `CenterCrop(crop_size)` on a batch.

    The shorter side is resized to `resize_size`, the longer one to
    `int(resize_size * long / short)` (bilinear, antialiased, as torchvision's tensor
    transform and PIL), then the central `crop_size` x `crop_size` square is kept, its
    offset rounded as torchvision's (`int(round((side - crop_size) / 2))`). Any input
    size up to an aspect ratio of 100 (`_resize_crop.MAX_ASPECT_RATIO`: the resized image
    would be up to 100 times `resize_size` long); the output is `crop_size` x `crop_size`.
    Values keep their range (no scaling). Images with a side of 0 pixels, or longer than
    100 times their shorter side, raise ValueError before anything is resized (where the
    sides are only known when run, in a `tf.data` map: InvalidArgumentError, same message).

    Args:
        resize_size: the shorter side after resizing, a positive integer.
        crop_size: the side of the square kept, a positive integer at most `resize_size`.
        data_format: "channels_last" or "channels_first" (default: Keras's).
        **kwargs: other Layer arguments (`name`, `dtype`).

    Input: images of shape (batch, height, width, channels) (channels_last), integers or
    floats. Integer inputs are cast to the layer's float dtype.
    """

    def __init__(
        self, resize_size: int, crop_size: int, data_format: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.resize_size, self.crop_size = resize_crop_sizes(resize_size, crop_size)
        self.data_format = _validation.data_format(data_format)

    def call(self, images):
        images = _pixels(images, "ResizeCenterCrop")
        if not keras.backend.is_float_dtype(images.dtype):
            images = ops.cast(images, self.compute_dtype)
        first = self.data_format == "channels_first"
        shape = ops.shape(images)
        height, width = shape[2:4] if first else shape[1:3]
        if isinstance(height, int) and isinstance(width, int):
            check_sides(height, width, images.shape)  # before the resize allocates
        new_height, new_width = resized_size(height, width, self.resize_size)
        if not isinstance(new_height, int):  # TensorFlow, sides unknown when traced
            import tensorflow as tf

            images = tf_check_sides(images, height, width)  # the shape as received
            channels_last = tf.transpose(images, (0, 2, 3, 1)) if first else images
            cropped = tf_resize_center_crop(channels_last, self.resize_size, self.crop_size)
            return tf.transpose(cropped, (0, 3, 1, 2)) if first else cropped
        resized = ops.image.resize(
            images,
            (new_height, new_width),
            interpolation="bilinear",
            antialias=True,
            data_format=self.data_format,
        )
        top, left = crop_start(new_height, self.crop_size), crop_start(new_width, self.crop_size)
        rows, columns = slice(top, top + self.crop_size), slice(left, left + self.crop_size)
        return resized[:, :, rows, columns] if first else resized[:, rows, columns, :]

    def compute_output_shape(self, input_shape):
        _check_rank(input_shape, "ResizeCenterCrop")
        side = self.crop_size
        if self.data_format == "channels_first":
            return (input_shape[0], input_shape[1], side, side)
        return (input_shape[0], side, side, input_shape[3])

    def get_config(self):
        return {
            **super().get_config(),
            "resize_size": self.resize_size,
            "crop_size": self.crop_size,
            "data_format": self.data_format,
        }


# The square sides `evaluation_preprocessing` accepts: below 16 a ShuffleNet's stride-32
# feature map is empty; above 4096 one float32 batch of 64 images is over 12 GB.
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 4096


def _default_resize_size(image_size):
    """torchvision's evaluation resize for a crop of `image_size`: its 256 / 224 ratio,
    `round(image_size * 256 / 224)` (256 for 224)."""
    return round(image_size * 256 / 224)


def evaluation_sizes(image_size: int, resize_size: int | None = None) -> tuple[int, int]:
    """The evaluation transform's sizes, checked: the crop's side and the shorter side
    before it.

    Args:
        image_size: the side of the square crop, a positive integer.
        resize_size: the shorter side before the crop, from `image_size` to twice it;
            None for `round(image_size * 256 / 224)`, torchvision's ratio.

    Returns:
        `(image_size, resize_size)` as integers.

    Raises:
        ValueError: a size out of range or not an integer.
    """
    if not _validation.is_integer(image_size) or not (
        MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE
    ):
        raise ValueError(
            f"`image_size` must be an integer from {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} (the "
            f"side of the square images the model takes). Received: image_size={image_size!r}"
        )
    image_size = int(image_size)
    if resize_size is None:
        resize_size = _default_resize_size(image_size)
    if not _validation.is_integer(resize_size) or not (image_size <= resize_size <= 2 * image_size):
        raise ValueError(
            f"`resize_size` (the shorter side before the central crop) must be an integer "
            f"from image_size ({image_size}) to 2 * image_size, or None for "
            f"{_default_resize_size(image_size)}. Received: resize_size={resize_size!r}"
        )
    return image_size, int(resize_size)


def resize_crop_sizes(resize_size, crop_size):
    """`(resize_size, crop_size)` of a resize and centre crop, checked: positive integers,
    the crop at most the resized shorter side."""
    resize_size = _validation.positive_int(resize_size, "resize_size")
    crop_size = _validation.positive_int(crop_size, "crop_size")
    if crop_size > resize_size:
        raise ValueError(
            f"`crop_size` must be at most `resize_size` ({resize_size}). "
            f"Received: crop_size={crop_size!r}"
        )
    return resize_size, crop_size


def scale_offset(mean: Any = IMAGENET_MEAN, std: Any = IMAGENET_STD) -> tuple[tuple, tuple]:
    """A normalisation `(x / 255 - mean) / std` per channel as keras-hub writes it,
    `x * scale + offset`: `(1 / (255 * std), -mean / std)`, one value per channel."""
    scale = tuple(float(1 / (255 * s)) for s in std)
    return scale, tuple(float(-m / s) for m, s in zip(mean, std, strict=True))


IMAGENET_SCALE, IMAGENET_OFFSET = scale_offset()


def evaluation_layers(
    image_size: int,
    resize_size: int,
    scale: Any = IMAGENET_SCALE,
    offset: Any = IMAGENET_OFFSET,
    data_format: str | None = None,
    dtype: Any = None,
) -> list[keras.layers.Layer]:
    """The one implementation of torchvision's evaluation transform, as three layers:
    `ToRGB` ("rgb"), `ResizeCenterCrop(resize_size, image_size)` ("resize_crop") and
    `Rescaling(scale, offset)` ("normalize": `x * scale + offset` per channel).
    `hub.ShuffleNetImageConverter` applies them; `evaluation_preprocessing` and
    `imagenet_preprocessing` are them as a `keras.Sequential`.

    Args:
        image_size: the side of the square output.
        resize_size: the shorter side after resizing, before the central crop.
        scale: a number, or one per channel (default: ImageNet's `1 / (255 * std)`).
        offset: the same, added after the scale (default: ImageNet's `-mean / std`).
        data_format: "channels_last" or "channels_first" (default: Keras's).
        dtype: the layers' dtype policy (default: Keras's).

    Returns:
        The three layers, in order.
    """
    data_format = _validation.data_format(data_format)
    shape = (-1, 1, 1) if data_format == "channels_first" else (1, 1, -1)

    def per_channel(value):  # shaped to broadcast over an image, whatever Keras's format
        value = np.asarray(value, dtype="float64")
        return float(value) if value.ndim == 0 else value.reshape(shape).tolist()

    return [
        ToRGB(data_format, dtype=dtype, name="rgb"),
        ResizeCenterCrop(resize_size, image_size, data_format, dtype=dtype, name="resize_crop"),
        keras.layers.Rescaling(
            per_channel(scale), per_channel(offset), dtype=dtype, name="normalize"
        ),
    ]


def evaluation_preprocessing(
    image_size: int = 224, resize_size: int | None = None, data_format: str | None = None
) -> keras.Sequential:
    """torchvision's ImageNet evaluation transform for square inputs of any size, as a
    `keras.Sequential` (for a `tf.data` map or the front of a model): the layers of
    `hub.ShuffleNetImageConverter` (`evaluation_layers`), with ImageNet's normalisation.

    Built-in layers and this module's only (no Lambda): it saves and loads with
    `safe_mode=True`. It is built when made, for batches of any size, sides and channel
    count. Its limits are its layers' (`ToRGB`, `ResizeCenterCrop`); pixel values are not
    checked: images in [0, 1] rather than [0, 255] are silently wrong.

    Args:
        image_size: the side of the square output, an integer from 16 to 4096.
        resize_size: the shorter side after resizing, before the central crop: an
            integer from `image_size` to `2 * image_size`. Default: torchvision's ratio,
            `round(image_size * 256 / 224)` (256 for 224).
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        A `keras.Sequential` from pixel values in [0, 255], a batch of any size
            (batch, height, width, channels), to (batch, image_size, image_size, 3).

    Raises:
        ValueError: `image_size`, `resize_size` or `data_format` out of range.

    Example:
        >>> preprocess = applications.evaluation_preprocessing(160)
        >>> preprocess(data.read_image("cat.jpg")[None]).shape
        TensorShape([1, 160, 160, 3])
    """
    image_size, resize_size = evaluation_sizes(image_size, resize_size)
    layers = evaluation_layers(image_size, resize_size, data_format=data_format)
    return _sequential(layers, f"evaluation_preprocessing_{image_size}")


def _sequential(layers, name):
    """`layers` as a `keras.Sequential` called `name`, built for batches of any shape."""
    # Built now, for any batch: Keras builds a Sequential without an input on its first
    # call, for that call's shape, and kept it even when that call failed.
    model = keras.Sequential([keras.Input(shape=(None, None, None)), *layers], name=name)
    # A wrong rank is refused by Keras before the call ("expected ndim=4"); a loaded copy
    # lacks this spec and is refused by its input layer instead, also unchanged.
    model.input_spec = keras.InputSpec(ndim=4, name="images")
    return model


def imagenet_preprocessing(width: float = 1.0, data_format: str | None = None) -> keras.Sequential:
    """`evaluation_preprocessing` at the sizes and normalisation of the ImageNet weights of
    `ShuffleNetV2(width)` (`CHECKPOINTS[width]`: 256 or 232, then 224); the same transform
    as its preset's `hub.ShuffleNetImageConverter`.

    Args:
        width: a key of `applications.CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        A `keras.Sequential`, as `evaluation_preprocessing`'s, named after the checkpoint
            (`shufflenet_v2_x1_0_preprocessing`).
    """
    entry = CHECKPOINTS[_validation.choice(width, tuple(CHECKPOINTS), "width")]
    # The entry's mean and std, as its preset's converter; named after the checkpoint
    # (two widths' transforms in one model need two names).
    scale, offset = scale_offset(entry.mean, entry.std)
    layers = evaluation_layers(entry.crop_size, entry.resize_size, scale, offset, data_format)
    return _sequential(layers, f"shufflenet_v2_{width_name(entry.width)}_preprocessing")


def preprocess_input(x: Any, data_format: str | None = None) -> Any:
    """Scales pixels from [0, 255] to [0, 1], then normalises each RGB channel with
    ImageNet's mean and standard deviation: `keras.applications.imagenet_utils.
    preprocess_input(x, mode="torch")` (torchvision's normalisation), on a copy (Keras's
    divides a float NumPy input in place) and after checking the channels.

    Args:
        x: an array or tensor of RGB images, values in [0, 255], rank 3 or 4.
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        The preprocessed images, same shape (a NumPy array for NumPy input).
    """
    data_format = _validation.data_format(data_format)
    is_numpy = isinstance(x, np.ndarray)
    x = ops.convert_to_tensor(x)
    if not keras.backend.is_float_dtype(x.dtype):
        x = ops.cast(x, keras.config.floatx())
    axis = -1 if data_format == "channels_last" else (0 if len(x.shape) == 3 else 1)
    if len(x.shape) not in (3, 4) or x.shape[axis] != 3:
        raise ValueError(
            f"`x` must be RGB images of rank 3 or 4 with 3 channels ({data_format}). "
            f"Received: x.shape={tuple(x.shape)}"
        )
    if is_numpy:
        x = ops.convert_to_numpy(x).copy()
    return imagenet_utils.preprocess_input(x, data_format=data_format, mode="torch")
