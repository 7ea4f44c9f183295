"""Full-integer (int8) LiteRT: the file, calibrated on `representative_data`, and its
check: accuracy on labelled test data against the float model's, and their top-1
agreement. An int8 file whose accuracy drop is beyond the bound the user sets
(`max_accuracy_drop`, in points) is refused (`Int8CheckError`) and none is left in place;
the agreement is reported, never a gate."""

import os
import pathlib
from collections.abc import Callable

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import remove, write_atomically
from keras_autoshuffle._startup import quiet_runtime
from keras_autoshuffle.export.checks import _single_input
from keras_autoshuffle.export.files import litert_flatbuffer, size_bytes
from keras_autoshuffle.export.litert_graph import one_conv_per_slice
from keras_autoshuffle.export.runner import open_runner

# Calibration: at least this many inputs; and on the scale of the test images (99th
# percentile of |x|) within this factor.
MIN_CALIBRATION_IMAGES = 16
MAX_SCALE_RATIO = 8.0
# The default bound on an int8 file's accuracy drop (float minus int8 accuracy on the test
# images), in percentage points; a file that quantization broke loses more. The argument,
# with the measured drops and the check's own sampling noise from the rows:
# docs/guide/export.md, "How much an int8 file may lose".
MAX_ACCURACY_DROP = 2.0


def export_int8(
    model: keras.Model, path: str | os.PathLike, representative_data: ArrayLike
) -> str | os.PathLike:
    """Writes a full-integer LiteRT model (atomically) calibrated on `representative_data`.

    Weights and activations are int8 (`TFLITE_BUILTINS_INT8` only: a layer without an
    int8 kernel fails the conversion instead of falling back to float); the inputs and
    outputs stay float32: the file quantizes its input and dequantizes its output, so it
    takes the same images as the float model and returns the same kind of outputs.

    Args:
        model: a single-input Keras model (TensorFlow backend), e.g. a folded network.
        path: the `.tflite` file to write.
        representative_data: a float32 batch of inputs, e.g. a few hundred training
            images; each is run through the float graph to choose the int8 ranges.

    Returns:
        `path`.
    """
    import tensorflow as tf

    data = np.asarray(representative_data, dtype="float32")
    model = one_conv_per_slice(model)  # no requantization per reader (`litert_graph`)

    def representative_dataset():
        for i in range(len(data)):
            yield [data[i : i + 1]]

    with quiet_runtime():  # the converter's "fully_quantize: 0, ..." line
        content = litert_flatbuffer(
            model,
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=representative_dataset,
            target_spec=tf.lite.TargetSpec([tf.lite.OpsSet.TFLITE_BUILTINS_INT8]),
        )
    return write_atomically(path, lambda partial: pathlib.Path(partial).write_bytes(content))


def _check_int8_arguments(model, representative_data, test_data):
    """The int8 export's arguments, checked before anything is written:
    (calibration images, test images, test labels)."""
    if representative_data is None:
        raise ValueError(
            'quantize="int8" needs `representative_data`, a batch of inputs (e.g. a few '
            "hundred training images) to calibrate the int8 ranges. "
            "Received: representative_data=None"
        )
    dtype = _dtype(representative_data)
    if dtype.kind not in "iuf":
        raise ValueError(
            "`representative_data` must be an array of real numbers (integer or float), "
            "preprocessed as the model's inputs. Received: representative_data of dtype "
            f"{dtype}"
        )
    calibration = _single_input(model, representative_data, "representative_data", "calibration")
    if len(calibration) < MIN_CALIBRATION_IMAGES:
        raise ValueError(
            f"`representative_data` must hold at least {MIN_CALIBRATION_IMAGES} inputs: fewer "
            "cannot estimate the activations' ranges (a few hundred training images are "
            f"usual). Received: representative_data.shape={calibration.shape}"
        )
    if not isinstance(test_data, (tuple, list)) or len(test_data) != 2:
        raise ValueError(
            'quantize="int8" needs `test_data=(images, labels)`, labelled examples to measure '
            "the int8 model's accuracy and top-1 agreement with the float model. "
            f"Received: test_data of type {type(test_data).__name__}"
        )
    images = _single_input(model, test_data[0], "test_data[0]", "the int8 check")
    classes = model.outputs[0].shape[-1]
    try:
        labels = np.asarray(test_data[1])
        valid = labels.dtype.kind in "iu" or (
            labels.dtype.kind == "f" and np.all(np.isfinite(labels) & (labels == np.round(labels)))
        )
    except (TypeError, ValueError):
        labels, valid = np.asarray([]), False
    if not valid or labels.shape != (len(images),) or np.any((labels < 0) | (labels >= classes)):
        raise ValueError(
            f"`test_data[1]` must be {len(images)} integer class labels in [0, {classes}), one "
            f"per image. Received: labels of shape {labels.shape}, dtype {labels.dtype}"
        )
    _check_ranges(calibration, images)
    return calibration, images, labels.astype("int64")


def _dtype(values):
    """The dtype NumPy gives `values` (object for what it cannot make an array of)."""
    try:
        return np.asarray(values).dtype
    except (TypeError, ValueError):
        return np.dtype(object)


def _check_ranges(calibration, images):
    """ValueError where the calibration inputs and the test images are on different
    scales (e.g. raw 0..255 pixels against normalised images): the int8 ranges would be
    chosen for inputs the file never sees. Compared by the 99th percentile of |x|."""
    scales = [float(np.percentile(np.abs(x), 99)) for x in (calibration, images)]
    low, high = sorted(scales)
    if high > MAX_SCALE_RATIO * max(low, 1e-6):
        raise ValueError(
            "`representative_data` and `test_data[0]` must be preprocessed alike: the int8 "
            "ranges come from the first and are checked on the second. Received: 99th "
            f"percentile of |x| {scales[0]:.4g} (representative_data) and {scales[1]:.4g} "
            "(test_data[0])"
        )


def int8_check(
    path: str,
    float_path: str,
    images: np.ndarray,
    labels: np.ndarray,
    float_outputs: np.ndarray,
) -> dict:
    """The int8 file's report (a `.tflite`, `.onnx` or OpenVINO file, run by
    `runner.open_runner`): its accuracy on (`images`, `labels`), the float
    model's (`float_outputs`, its outputs on `images`), the drop between them in
    percentage points, their top-1 agreement, and the size ratio float bytes / int8 bytes.

    Args:
        path: the int8 file.
        float_path: the float file it was converted from.
        images: float32 test inputs.
        labels: their integer labels.
        float_outputs: the float model's outputs on `images`.

    Returns:
        `{"accuracy", "float_accuracy", "accuracy_drop", "top1_agreement", "size_ratio",
            "bytes", "float_bytes", "test_examples", "path"}`.
    """
    predicted = np.argmax(open_runner(path).run(images), axis=-1)
    expected = np.argmax(float_outputs, axis=-1)
    size, float_size = size_bytes(path), size_bytes(float_path)
    # In whole images, then points: 5 of 500 images is 1.0 point exactly, not the
    # 1.0000000000000009 of 100 * (0.828 - 0.818), which a bound of 1.0 would refuse.
    lost = int(np.sum(expected == labels)) - int(np.sum(predicted == labels))
    return {
        "accuracy": float(np.mean(predicted == labels)),
        "float_accuracy": float(np.mean(expected == labels)),
        "accuracy_drop": 100 * lost / len(labels),
        "top1_agreement": float(np.mean(predicted == expected)),
        "size_ratio": float_size / size,
        "bytes": size,
        "float_bytes": float_size,
        "test_examples": len(labels),
        "path": path,
    }


def write_checked(
    key: str,
    write_file: Callable[[str], object],
    path: str,
    float_path: str,
    calibration: np.ndarray,
    test: tuple[np.ndarray, np.ndarray],
    float_outputs: np.ndarray,
    max_accuracy_drop: float,
) -> dict:
    """Writes an int8 file with `write_file(partial)`, checks it on `test` (`int8_check`)
    and moves it to `path` only when its accuracy drop is within `max_accuracy_drop`
    (`refuse_beyond_bound`).

    Args:
        key: the file's result key ("int8" for LiteRT, "onnx_int8", "openvino_int8").
        write_file: writes the file at the path it is given.
        path: where the file goes when it passes.
        float_path: the float file it is quantized from (the size ratio).
        calibration: the inputs `write_file` calibrates on (their count is reported).
        test: (images, labels): float32 test inputs and their integer labels.
        float_outputs: the float model's outputs on the test images.
        max_accuracy_drop: the most the int8 accuracy may be below the float model's on
            `test`, in percentage points.

    Returns:
        The check's entry (`int8_check`'s keys, `max_accuracy_drop` and
            `calibration_examples`).

    Raises:
        Int8CheckError: a drop beyond `max_accuracy_drop` (naming `key`); any earlier
            file at `path` is removed.
    """
    max_accuracy_drop = _validation.percentage_points(max_accuracy_drop, "max_accuracy_drop")
    images, labels = test
    entry = {}

    def write(partial):
        write_file(partial)
        entry.update(int8_check(partial, float_path, images, labels, float_outputs))
        entry["max_accuracy_drop"] = max_accuracy_drop
        refuse_beyond_bound(entry, key, os.path.basename(path))

    try:
        write_atomically(path, write)
    except Int8CheckError:
        remove(path)  # an earlier export's int8 file would not match the new float files
        raise
    return {**entry, "path": path, "calibration_examples": len(calibration)}


def _export_int8_checked(
    model, path, float_path, calibration, images, labels, float_outputs, max_accuracy_drop
):
    """`export_int8` whose file is moved into place only when its accuracy drop is within
    `max_accuracy_drop`; beyond it the export is refused and no int8 file is left at `path`."""
    return write_checked(
        "int8",
        lambda partial: export_int8(model, partial, calibration),
        path,
        float_path,
        calibration,
        (images, labels),
        float_outputs,
        max_accuracy_drop,
    )


# The runtime of each int8 file's key (in messages and reports).
INT8_RUNTIMES = {"int8": "LiteRT", "onnx_int8": "ONNX", "openvino_int8": "OpenVINO"}


def refuse_beyond_bound(entry: dict, key: str, filename: str) -> None:
    """Raises `Int8CheckError` when the check `entry` of the int8 file `key` ("int8" for
    LiteRT, "onnx_int8", "openvino_int8"; written as `filename`) measured an accuracy drop
    (`accuracy_drop`, points) beyond its bound (`max_accuracy_drop`). The message gives
    what was measured (`accuracy`, `float_accuracy`, `top1_agreement` on `test_examples`)
    and names the option that allows more."""
    drop, bound, count = entry["accuracy_drop"], entry["max_accuracy_drop"], entry["test_examples"]
    # The drop is a whole number of images: only rounding of the points is forgiven.
    if drop <= bound + 1e-9:
        return
    raise Int8CheckError(
        entry,
        f"The int8 {INT8_RUNTIMES[key]} model loses {drop:.2f} points of accuracy "
        f"({entry['accuracy']:.4f} against the float model's {entry['float_accuracy']:.4f} on "
        f"{count} test image{'s' * (count != 1)}, one image = {100 / count:.2f} points; top-1 "
        f"agreement {entry['top1_agreement']:.4f}), more than the bound of {bound:g} points: no "
        f"{filename} written. Allow more with --int8-max-drop POINTS (Python: "
        "max_accuracy_drop=), or calibrate on more representative images. "
        f"Received: max_accuracy_drop={bound:g}",
        key,
    )


class Int8CheckError(ValueError):
    """An int8 file's accuracy drop is beyond the export's bound (`max_accuracy_drop`);
    `check` holds the measured numbers (the check's entry, without a file), `key` the
    file's result key ("int8" for LiteRT, "onnx_int8", "openvino_int8")."""

    def __init__(self, check: dict, message: str, key: str = "int8") -> None:
        super().__init__(message)
        self.check = {k: v for k, v in check.items() if k != "path"}
        self.key = key
