"""Each exported file of a fine-tuning run measured on its validation images: accuracy,
top-1 agreement with the Keras model, size and latency per image on this machine.

`measure_files` runs files that take the network's normalised input on the validation
pipeline's images; `measure_raw_files` runs files holding their preprocessing on the
validation image files as decoded, through `prediction.Classifier` (as an app would)."""

import keras
import numpy as np

from keras_autoshuffle import export as export_lib
from keras_autoshuffle.finetuning.report import file_latency

# Validation images each exported file is run on (every one, up to this many).
MAX_CHECKED_IMAGES = 10_000
# Files holding their preprocessing run on full-size decoded images (a 12-megapixel photo
# takes about a second in LiteRT): the first this many validation files.
MAX_RAW_CHECKED_IMAGES = 500


def _runner(fmt, path):
    """`run(batch) -> outputs` for one file, one image at a time (any batch file)."""
    if fmt in ("litert", "int8"):
        interpreter = export_lib.litert_interpreter(path, batch=1, num_threads=1)
        to_input = _described_input(path)
        return lambda image: export_lib.litert_run(interpreter, to_input(image))
    if fmt in ("onnx", "onnx_int8"):
        session = export_lib.onnx_session(path, num_threads=1)
        return lambda image: export_lib.onnx_run(session, image)
    compiled = export_lib.openvino_model(path, num_threads=1, batch=1)
    return lambda image: export_lib.openvino_run(compiled, image)


def _described_input(path):
    """The validation pipeline's images (ImageNet-normalised) as the `.tflite` file at
    `path` takes them: `(pixel - mean) / std` as its metadata says; as they are without."""
    from keras_autoshuffle.export import metadata

    described = (
        metadata.read_litert_metadata(path) if export_lib.is_installed("mediapipe") else None
    )
    if described is None:
        return lambda image: image
    pixel_mean, pixel_std = (
        np.float32(metadata.IMAGENET_PIXEL_MEAN),
        np.float32(metadata.IMAGENET_PIXEL_STD),
    )
    mean, std = np.float32(described["mean"]), np.float32(described["std"])
    return lambda image: (image * pixel_std + pixel_mean - mean) / std


def measure_files(files: dict, val_data, keras_probabilities: np.ndarray, input_shape) -> dict:
    """{format: {"path", "size_bytes", "accuracy", "top1_agreement", "examples",
    "latency"}} for `files` ({format: path}; "int8", "onnx_int8", "openvino_int8" for the
    full-integer `.tflite`, `.onnx` and OpenVINO folder), run on
    `val_data`'s evaluation images (the first MAX_CHECKED_IMAGES), against the Keras
    model's `keras_probabilities` on them."""
    runners = {fmt: _runner(fmt, path) for fmt, path in files.items()}
    predictions = {fmt: [] for fmt in files}
    labels, count = [], 0
    for images, batch_labels in val_data.eval_dataset(64):
        images = keras.ops.convert_to_numpy(images)[: MAX_CHECKED_IMAGES - count]
        for fmt, run in runners.items():
            outputs = [run(np.ascontiguousarray(image[None])) for image in images]
            predictions[fmt].extend(int(np.argmax(out)) for out in outputs)
        labels.extend(keras.ops.convert_to_numpy(batch_labels)[: len(images)])
        count += len(images)
        if count >= MAX_CHECKED_IMAGES:
            break
    return {
        fmt: {
            **_entry(path, predictions[fmt], np.asarray(labels), keras_probabilities),
            "latency": file_latency(path, fmt, (1, *input_shape), num_threads=1),
        }
        for fmt, path in files.items()
    }


def _entry(path, predicted, labels, keras_probabilities):
    """A file's entry from its top-1 `predicted` on the first `len(labels)` images."""
    predicted, count = np.asarray(predicted), len(labels)
    reference = np.argmax(keras_probabilities[:count], axis=-1)
    return {
        "path": path,
        "size_bytes": export_lib.size_bytes(path),
        "accuracy": float(np.mean(predicted == labels)),
        "top1_agreement": float(np.mean(predicted == reference)),
        "examples": int(count),
    }


def measure_raw_files(
    files: dict, val_data, keras_probabilities: np.ndarray, latency_shape: tuple[int, ...]
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
            "latency": file_latency(path, fmt, shape, num_threads=1, pixels=True),
            "latency_input_shape": list(shape),
        }
        for fmt, path in files.items()
    }
