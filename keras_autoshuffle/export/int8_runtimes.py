"""Full-integer (int8) ONNX and OpenVINO files, quantized from the float files the
export already wrote: ONNX by ONNX Runtime's `quantize_static` (per-channel int8 weights,
int8 activations calibrated on `representative_data`), OpenVINO by NNCF's post-training
`nncf.quantize` (no torch). Each is checked against the float model like LiteRT's int8
file (`int8.Int8CheckError` past the limits, and no file is left behind)."""

import os
from collections.abc import Callable

import numpy as np

from keras_autoshuffle._atomic import remove, write_atomically
from keras_autoshuffle.export.int8 import Int8CheckError, refuse_past_limits
from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML, onnx_outputs, openvino_outputs

ONNX_INT8_FILENAME = "model_int8.onnx"
OPENVINO_INT8_DIRNAME = "openvino_int8"

# QDQ with uint8 activations (int8 per-channel weights): on a 2-core AMD EPYC (AVX2, no
# VNNI), ONNX Runtime 1.32, ShuffleNet v2 1.0x at 224, batch 1, 2 threads, 5 interleaved
# rounds, paired medians vs float: QDQ u8 0.85x, QOperator u8 0.86x (a tie), QDQ s8 1.25x,
# QOperator s8 4.0x (int8 activations have no fast kernel there).
ONNX_QUANT_FORMAT = "QDQ"
ONNX_ACTIVATION_TYPE = "QUInt8"


def _calibration_reader(input_name: str, images: np.ndarray):
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        # One image a call: the float file's batch dimension is free, calibration is exact.
        def __init__(self):
            self._rows = iter(range(len(images)))

        def get_next(self):
            i = next(self._rows, None)
            return None if i is None else {input_name: images[i : i + 1]}

    return _Reader()


def export_onnx_int8(
    float_path: str | os.PathLike,
    path: str | os.PathLike,
    representative_data: np.ndarray,
    quant_format: str = ONNX_QUANT_FORMAT,
    activation_type: str = ONNX_ACTIVATION_TYPE,
) -> str | os.PathLike:
    """Writes (atomically) a full-integer ONNX file quantized from the float one.

    Args:
        float_path: the float `model.onnx` written by `export_onnx` (NHWC float32 input).
        path: the int8 `.onnx` file to write.
        representative_data: float32 inputs of the float file's shape, e.g. a few hundred
            training images, run through the float graph to choose the int8 ranges.
        quant_format: "QDQ" (the default) or "QOperator" (QLinearConv).
        activation_type: "QUInt8" (the default) or "QInt8", the activations' type.

    Returns:
        `path`.
    """
    import onnxruntime
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    data = np.asarray(representative_data, dtype="float32")
    name = (
        onnxruntime.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
        .get_inputs()[0]
        .name
    )

    def write(partial):
        quantize_static(
            str(float_path),
            partial,
            _calibration_reader(name, data),
            quant_format=getattr(QuantFormat, quant_format),
            per_channel=True,
            # 7-bit weights: u8 x s8 products saturate the 16-bit sums of AVX2 kernels
            # without VNNI (tiny digits net: top-1 agreement 0.76 without, 0.95 with).
            reduce_range=True,
            activation_type=getattr(QuantType, activation_type),
            weight_type=QuantType.QInt8,
        )

    return write_atomically(path, write)


def export_openvino_int8(
    float_path: str | os.PathLike, path: str | os.PathLike, representative_data: np.ndarray
) -> str | os.PathLike:
    """Writes (atomically) an int8 OpenVINO IR folder by NNCF post-training quantization.

    Args:
        float_path: the float IR folder written by `export_openvino`.
        path: the int8 IR folder to write (`model.xml`, `model.bin`).
        representative_data: float32 inputs, e.g. a few hundred training images.

    Returns:
        `path`.
    """
    import nncf
    import openvino

    data = np.asarray(representative_data, dtype="float32")
    model = openvino.Core().read_model(os.path.join(float_path, OPENVINO_XML))
    dataset = nncf.Dataset([data[i : i + 1] for i in range(len(data))])

    def write(partial):
        os.makedirs(partial)
        quantized = nncf.quantize(model, dataset, subset_size=len(data))
        openvino.save_model(quantized, os.path.join(partial, OPENVINO_XML), compress_to_fp16=False)

    return write_atomically(path, write)


def _checked(
    label: str,
    write_file: Callable[[str], object],
    predict: Callable[[str, np.ndarray], np.ndarray],
    path: str,
    images: np.ndarray,
    labels: np.ndarray,
    float_outputs: np.ndarray,
    min_agreement: float,
    max_drop: float,
) -> dict:
    """Writes with `write_file` to a scratch path, checks it against `float_outputs` on
    (`images`, `labels`) and moves it to `path` only when it passes; else raises
    `Int8CheckError` and removes any earlier file at `path`."""
    entry = {}

    def write(partial):
        write_file(partial)
        predicted = np.argmax(predict(partial, images), axis=-1)
        expected = np.argmax(float_outputs, axis=-1)
        entry.update(
            accuracy=float(np.mean(predicted == labels)),
            float_accuracy=float(np.mean(expected == labels)),
            top1_agreement=float(np.mean(predicted == expected)),
            test_examples=len(labels),
        )
        refuse_past_limits(entry, label, os.path.basename(path), min_agreement, max_drop)

    try:
        write_atomically(path, write)
    except Int8CheckError:
        remove(path)
        raise
    return {**entry, "path": path}


def export_onnx_int8_checked(
    float_path: str,
    path: str,
    calibration: np.ndarray,
    images: np.ndarray,
    labels: np.ndarray,
    float_outputs: np.ndarray,
    min_agreement: float,
    max_drop: float,
) -> dict:
    """`export_onnx_int8`, kept only when ONNX Runtime's predictions on `images` pass the
    check against `float_outputs` (top-1 agreement, accuracy drop on `labels`).

    Args:
        float_path: the float ONNX file.
        path: the int8 ONNX file to write.
        calibration: float32 calibration inputs.
        images: float32 test inputs.
        labels: integer labels of `images`.
        float_outputs: the float model's outputs on `images`.
        min_agreement: the least top-1 agreement (fraction).
        max_drop: the most accuracy drop (points).

    Returns:
        The check's entry: accuracy, float_accuracy, top1_agreement, test_examples, path.

    Raises:
        Int8CheckError: the int8 file fails the check (no file left at `path`).
    """
    return _checked(
        "ONNX",
        lambda partial: export_onnx_int8(float_path, partial, calibration),
        onnx_outputs,
        path,
        images,
        labels,
        float_outputs,
        min_agreement,
        max_drop,
    )


def export_openvino_int8_checked(
    float_path: str,
    path: str,
    calibration: np.ndarray,
    images: np.ndarray,
    labels: np.ndarray,
    float_outputs: np.ndarray,
    min_agreement: float,
    max_drop: float,
) -> dict:
    """`export_openvino_int8`, kept only when OpenVINO's predictions (f32 inference
    precision for the non-quantized parts, whatever the CPU) pass the check.

    Args:
        float_path: the float OpenVINO IR folder.
        path: the int8 IR folder to write.
        calibration: float32 calibration inputs.
        images: float32 test inputs.
        labels: integer labels of `images`.
        float_outputs: the float model's outputs on `images`.
        min_agreement: the least top-1 agreement (fraction).
        max_drop: the most accuracy drop (points).

    Returns:
        The check's entry: accuracy, float_accuracy, top1_agreement, test_examples, path.

    Raises:
        Int8CheckError: the int8 folder fails the check (no folder left at `path`).
    """
    return _checked(
        "OpenVINO",
        lambda partial: export_openvino_int8(float_path, partial, calibration),
        openvino_outputs,
        path,
        images,
        labels,
        float_outputs,
        min_agreement,
        max_drop,
    )
