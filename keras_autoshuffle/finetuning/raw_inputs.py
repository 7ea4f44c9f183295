"""A classifier that takes raw RGB pixels of any size, its preprocessing inside: for
exported files (LiteRT, ONNX, OpenVINO) a phone or a server feeds decoded images to as they
are. The preprocessing is torchvision's evaluation transform, computed with ops LiteRT has
as builtins (`applications.evaluation_preprocessing`'s antialiased resize is a Flex op).
"""

from typing import Any

import keras
import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._resize_crop import crop_start, resized_size
from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD
from keras_autoshuffle.applications.preprocessing import evaluation_sizes, resize_crop_sizes

# The export formats (`export.FORMATS` names) whose files of a `raw_input_model` take uint8
# images of any size, each checked against Keras in tests/test_raw_inputs.py. Not int8: its
# calibration feeds float32 images, which the uint8 input refuses, and with a float32
# input the resize itself is quantized (crops 0.5 to 3.0 off after normalisation).
RAW_INPUT_FORMATS = ("keras", "saved_model", "litert", "onnx", "openvino")


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class RawImagePreprocessing(keras.layers.Layer):
    """torchvision's evaluation transform of RGB images whose sides are read when run,
    with LiteRT builtin ops only: `Resize(resize_size)` (bilinear, antialiased),
    `CenterCrop(crop_size)`, then `(pixel / 255 - mean) / std` per channel.

    Only the crop's outputs are computed, each the antialiased (triangle) filter's
    weighted sum of the input rows, then columns, one tap per turn of a loop: the same
    numbers as `tf.image.resize(antialias=True)` to float32 rounding, at a cost that grows
    with the image's pixels.

    Args:
        resize_size: the shorter side after resizing, a positive integer.
        crop_size: the side of the square kept, a positive integer at most `resize_size`.
        mean: the three channels' means, on the [0, 1] scale (default: ImageNet's).
        std: the three channels' standard deviations, positive (default: ImageNet's).
        **kwargs: other Layer arguments (`name`, `dtype`).

    Input: (batch, height, width, 3) RGB images of one size, uint8 or floats in [0, 255],
    channels last; TensorFlow backend. Output: (batch, crop_size, crop_size, 3).
    """

    def __init__(
        self,
        resize_size: int,
        crop_size: int,
        mean: tuple[float, float, float] | list[float] = IMAGENET_MEAN,
        std: tuple[float, float, float] | list[float] = IMAGENET_STD,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.resize_size, self.crop_size = resize_crop_sizes(resize_size, crop_size)
        self.mean = _channel_values(mean, "mean", positive=False)
        self.std = _channel_values(std, "std", positive=True)

    def call(self, images):
        import tensorflow as tf

        images = tf.convert_to_tensor(images)
        _check_images(images)
        shape = tf.shape(images)
        batch, height, width = shape[0], shape[1], shape[2]
        new_height, new_width = resized_size(height, width, self.resize_size)
        rows = _taps(height, new_height, self.crop_size)
        columns = _taps(width, new_width, self.crop_size)
        crop = self.crop_size
        # Only the columns the crop reads, channels folded in: (batch, height, wide * 3).
        wide = columns.end - columns.start
        window = images[:, :, columns.start : columns.end, :]
        window = tf.reshape(window, tf.stack([batch, height, wide * 3]))
        filtered = _filter(window, rows.indices, rows, tf.stack([batch, crop, wide * 3]))
        # Columns as rows: (batch, wide, crop * 3), filtered the same way.
        filtered = tf.reshape(filtered, tf.stack([batch, crop, wide, 3]))
        filtered = tf.transpose(filtered, (0, 2, 1, 3))
        filtered = tf.reshape(filtered, tf.stack([batch, wide, crop * 3]))
        indices = columns.indices - columns.start  # into the window
        filtered = _filter(filtered, indices, columns, tf.stack([batch, crop, crop * 3]))
        crops = tf.transpose(tf.reshape(filtered, (-1, crop, crop, 3)), (0, 2, 1, 3))
        # (pixel / 255 - mean) / std as one multiply and add, constants in the graph.
        scale = np.array([1 / (255 * s) for s in self.std], "float32")
        offset = np.array([-m / s for m, s in zip(self.mean, self.std, strict=True)], "float32")
        return tf.cast(crops * scale + offset, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.crop_size, self.crop_size, 3)

    def get_config(self):
        return {
            **super().get_config(),
            "resize_size": self.resize_size,
            "crop_size": self.crop_size,
            "mean": list(self.mean),
            "std": list(self.std),
        }


def _channel_values(values, name, positive):
    """`values` as a tuple of three finite floats (positive if asked); else ValueError
    naming `name`."""
    try:
        valid = len(values) == 3 and all(map(_validation.is_finite_number, values))
    except TypeError:  # not a sequence
        valid = False
    if not valid or (positive and min(values) <= 0):
        kind = "positive numbers" if positive else "numbers"
        raise ValueError(
            f"`{name}` must be three finite {kind}, one per RGB channel. "
            f"Received: {name}={values!r}"
        )
    return tuple(float(v) for v in values)


def _check_images(images):
    """ValueError naming `images` unless it is a batch of RGB pixel values (rank 4, 3
    channels, integers or floats) without a side of 0 pixels known when traced."""
    dtype = keras.backend.standardize_dtype(images.dtype)
    if not (keras.backend.is_float_dtype(dtype) or keras.backend.is_int_dtype(dtype)):
        raise ValueError(
            f"RawImagePreprocessing takes pixel values, integers or floats. "
            f"Received: images.dtype={dtype}"
        )
    shape = tuple(images.shape)
    if len(shape) != 4 or shape[3] != 3 or 0 in shape[1:3]:
        raise ValueError(
            "RawImagePreprocessing takes a batch of RGB images (batch, height, width, 3), "
            f"at least 1 pixel each side. Received: images.shape={shape}"
        )


class _Taps:
    """The antialiased filter of one axis, restricted to the crop's outputs: `count` taps
    each, `indices` and `weights` (crop, count) into the input pixels, which span
    [`start`, `end`)."""

    def __init__(self, count, indices, weights, start, end):
        self.count, self.indices, self.weights = count, indices, weights
        self.start, self.end = start, end


def _taps(side, new_side, crop):
    """`tf.image.resize(antialias=True)`'s bilinear filter from `side` input pixels to
    `new_side` (int32 scalar tensors), for the `crop` central outputs CenterCrop keeps."""
    import tensorflow as tf

    scale = tf.cast(side, "float32") / tf.cast(new_side, "float32")  # in per out pixel
    support = tf.maximum(scale, 1.0)  # the triangle's half-width, in input pixels
    centers = (tf.cast(crop_start(new_side, crop) + tf.range(crop), "float32") + 0.5) * scale
    first = tf.cast(tf.math.ceil(centers - support - 0.5), "int32")
    count = tf.cast(tf.math.ceil(2.0 * support), "int32") + 1  # reaches centre + support
    indices = first[:, None] + tf.range(count)[None, :]
    distance = tf.abs(tf.cast(indices, "float32") + 0.5 - centers[:, None])
    weights = tf.maximum(0.0, 1.0 - distance / support)
    weights = tf.where((indices >= 0) & (indices < side), weights, 0.0)  # off the image
    weights = weights / tf.reduce_sum(weights, axis=1, keepdims=True)
    start = tf.maximum(0, first[0])
    end = tf.minimum(side, first[-1] + count)
    return _Taps(count, tf.clip_by_value(indices, 0, side - 1), weights, start, end)


def _filter(values, indices, taps, shape):
    """The weighted sums of `values`' rows (axis 1) for each output, `shape` (batch, crop,
    n), float32: `taps.count` turns of a `tf.while_loop` (a LiteRT WHILE), each gathering
    one row per output (`indices[:, tap]`), casting it to float32 and adding it, times
    its weight (`taps.weights[:, tap]`), to the sums."""
    import tensorflow as tf

    def add_tap(tap, total):
        rows = tf.cast(tf.gather(values, indices[:, tap], axis=1), "float32")
        return tap + 1, total + rows * taps.weights[:, tap][None, :, None]

    _, total = tf.while_loop(
        lambda tap, total: tap < taps.count, add_tap, (tf.constant(0), tf.zeros(shape))
    )
    return total


def raw_input_model(
    classifier: keras.Model, image_size: int, resize_size: int | None = None
) -> keras.Model:
    """`classifier` with its preprocessing inside: a model from uint8 RGB images of any
    size, (batch, height, width, 3), through `RawImagePreprocessing(resize_size,
    image_size)` to the classifier's outputs, for files a phone feeds decoded images to
    as they are. It saves and loads as `.keras` with `safe_mode=True`, and exports to
    the `RAW_INPUT_FORMATS` with the sides unknown (not int8: quantize the classifier
    alone). Its crops equal `applications.evaluation_preprocessing(image_size,
    resize_size)`'s to float32 rounding.

    Args:
        classifier: a Keras model taking (batch, image_size, image_size, 3) normalised
            images (its sides `image_size` or unknown), e.g. a folded fine-tuned network.
        image_size: the side of the classifier's square input, an integer from 16 to 4096.
        resize_size: the shorter side after resizing, before the central crop: an integer
            from `image_size` to `2 * image_size`. Default: torchvision's ratio,
            `round(image_size * 256 / 224)` (256 for 224).

    Returns:
        A `keras.Model` from uint8 RGB images (batch, height, width, 3) of any size to
            `classifier`'s outputs.

    Raises:
        ValueError: `classifier` not a Keras model with one input of that shape,
            `image_size` or `resize_size` out of range.

    Example:
        >>> model = raw_input_model(folded, 224)
        >>> export.export_litert(model, "model.tflite")
        >>> export.open_runner("model.tflite").run(pixels[None])  # pixels: uint8 (480, 640, 3)
    """
    image_size, resize_size = evaluation_sizes(image_size, resize_size)
    _check_classifier(classifier, image_size)
    images = keras.Input(shape=(None, None, 3), dtype="uint8", name="images")
    normalised = RawImagePreprocessing(int(resize_size), image_size, name="preprocessing")(images)
    return keras.Model(images, classifier(normalised), name=f"{classifier.name}_raw_input")


def _check_classifier(classifier, image_size):
    """ValueError naming `classifier` unless it is a Keras model with one input that takes
    (batch, image_size, image_size, 3) images."""
    if not isinstance(classifier, keras.Model):
        raise ValueError(
            f"`classifier` must be a keras.Model. Received: classifier of type "
            f"{type(classifier).__name__}"
        )
    inputs = getattr(classifier, "inputs", None) or []
    shape = tuple(inputs[0].shape) if len(inputs) == 1 else None
    fits = (
        shape is not None
        and len(shape) == 4
        and shape[3] == 3
        and all(side in (None, image_size) for side in shape[1:3])
    )
    if not fits:
        received = shape if len(inputs) <= 1 else [tuple(i.shape) for i in inputs]
        raise ValueError(
            f"`classifier` must take one input of shape (batch, {image_size}, {image_size}, "
            f"3) (image_size={image_size}). Received: classifier input shape={received}"
        )
