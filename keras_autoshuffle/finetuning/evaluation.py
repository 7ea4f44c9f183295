"""Each exported file of a fine-tuning run measured on its validation images: accuracy,
top-1 agreement with the Keras model, size and latency per image on this machine.

`measure_files` runs files that take the network's normalised input on the validation
pipeline's images; `measure_raw_files` runs files holding their preprocessing on the
validation image files as decoded, through `prediction.Classifier` (as an app would)."""

from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_autoshuffle.export.files import size_bytes
from keras_autoshuffle.export.metadata import IMAGENET_PIXEL_MEAN as PIXEL_MEAN
from keras_autoshuffle.export.metadata import IMAGENET_PIXEL_STD as PIXEL_STD
from keras_autoshuffle.export.runner import open_runner
from keras_autoshuffle.finetuning.metrics import file_latency

if TYPE_CHECKING:
    import tensorflow as tf

# Validation images each exported file is run on (every one, up to this many).
MAX_CHECKED_IMAGES = 10_000
# Files holding their preprocessing run on full-size decoded images (a 12-megapixel photo
# takes about a second in LiteRT): the first this many validation files.
MAX_RAW_CHECKED_IMAGES = 500


def measure_files(
    files: dict,
    val_data: "tf.data.Dataset",
    keras_probabilities: np.ndarray,
    input_shape: tuple[int, ...],
) -> dict:
    """{format: {"path", "size_bytes", "accuracy", "top1_agreement", "examples",
    "latency"}} for `files` ({format: path}; "int8", "onnx_int8", "openvino_int8" for the
    full-integer `.tflite`, `.onnx` and OpenVINO folder), run on
    `val_data`'s evaluation images (the first MAX_CHECKED_IMAGES), against the Keras
    model's `keras_probabilities` on them."""
    runners = {fmt: open_runner(path, num_threads=1) for fmt, path in files.items()}
    predictions = {fmt: [] for fmt in files}
    labels, count = [], 0
    for images, batch_labels in val_data.eval_dataset(64):
        images = keras.ops.convert_to_numpy(images)[: MAX_CHECKED_IMAGES - count]
        for fmt, runner in runners.items():  # one image at a time, as an app runs them
            inputs = _file_inputs(runner, images)
            outputs = [runner.run(np.ascontiguousarray(image[None])) for image in inputs]
            predictions[fmt].extend(int(np.argmax(out)) for out in outputs)
        labels.extend(keras.ops.convert_to_numpy(batch_labels)[: len(images)])
        count += len(images)
        if count >= MAX_CHECKED_IMAGES:
            break
    return {
        fmt: {
            **_entry(path, predictions[fmt], np.asarray(labels), keras_probabilities),
            "latency": file_latency(path, (1, *input_shape), num_threads=1),
        }
        for fmt, path in files.items()
    }


def _file_inputs(runner, images):
    """The pipeline's ImageNet-normalised `images` as the file of `runner` takes them: back
    to pixels, then normalised as its metadata declares (pixel / 255 for a file with
    ImageNet's normalisation inside, described mean 0, std 255); as they are for a file
    without metadata (it takes the network's input)."""
    if runner.input.mean is None:
        return images
    return runner.input.normalize(images * np.float32(PIXEL_STD) + np.float32(PIXEL_MEAN))


def _entry(path, predicted, labels, keras_probabilities):
    """A file's entry from its top-1 `predicted` on the first `len(labels)` images."""
    predicted, count = np.asarray(predicted), len(labels)
    reference = np.argmax(keras_probabilities[:count], axis=-1)
    return {
        "path": path,
        "size_bytes": size_bytes(path),
        "accuracy": float(np.mean(predicted == labels)),
        "top1_agreement": float(np.mean(predicted == reference)),
        "examples": int(count),
    }


def measure_raw_files(
    files: dict,
    val_data: "tf.data.Dataset",
    keras_probabilities: np.ndarray,
    latency_shape: tuple[int, ...],
) -> dict:
    """As `measure_files`, for files that take raw pixels (`finetuning.raw_input_model`):
    each is loaded with `prediction.Classifier.from_file` (its side files beside it) and
    run on the validation image files themselves, one decoded image of its own size at a
    time (the first MAX_RAW_CHECKED_IMAGES); the latency is of one uint8 image of
    `latency_shape` (height, width, 3), recorded as the entry's "latency_input_shape"."""
    from keras_autoshuffle.data.images import read_image
    from keras_autoshuffle.prediction import Classifier

    classifiers = {fmt: Classifier.from_file(path) for fmt, path in files.items()}
    count = min(val_data.num_examples, MAX_RAW_CHECKED_IMAGES)
    predictions = {fmt: [] for fmt in files}
    for index in range(count):
        image = read_image(val_data.path(index))
        for fmt, classifier in classifiers.items():
            predictions[fmt].append(int(np.argmax(classifier.predict([image])[0])))
    shape = (1, *(int(side) for side in latency_shape))
    return {
        fmt: {
            **_entry(path, predictions[fmt], val_data.labels[:count], keras_probabilities),
            "latency": file_latency(path, shape, num_threads=1, pixels=True),
            "latency_input_shape": list(shape),
        }
        for fmt, path in files.items()
    }
