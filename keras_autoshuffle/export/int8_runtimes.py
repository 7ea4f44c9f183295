"""Full-integer (int8) ONNX and OpenVINO files, quantized from the float files the
export already wrote: ONNX by ONNX Runtime's `quantize_static` (per-channel int8 weights,
int8 activations calibrated on `representative_data`), OpenVINO by NNCF's post-training
`nncf.quantize` (no torch). Each is checked against the float model like LiteRT's int8
file (`int8.Int8CheckError` beyond `max_accuracy_drop`, and no file is left behind):
`export_int8_file_checked`, which `export_model(quantize="int8")` calls."""

import contextlib
import io
import logging
import os
from tempfile import TemporaryDirectory

import numpy as np

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle._cpu import cpu_info
from keras_autoshuffle.export.int8 import write_checked
from keras_autoshuffle.export.onnx_graph import drop_unread_dequantize
from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML, onnx_session
from keras_autoshuffle.export.runner import SUFFIXES

# QDQ with uint8 activations (int8 per-channel weights): on a 2-core AMD EPYC (AVX2, no
# VNNI), ONNX Runtime 1.32, ShuffleNet v2 1.0x at 224, batch 1, 2 threads, 5 interleaved
# rounds, paired medians vs float: QDQ u8 0.85x, QOperator u8 0.86x (a tie), QDQ s8 1.25x,
# QOperator s8 4.0x (int8 activations have no fast kernel there).
ONNX_QUANT_FORMAT = "QDQ"
ONNX_ACTIVATION_TYPE = "QUInt8"

# The weights' bits: 7 (the default) runs right on every x86 CPU; 8 only where the CPU
# that runs the file has VNNI: without it, int8 kernels sum pairs of u8 x s8 products in
# 16 bits, which 8-bit weights saturate, and the check on the writing CPU cannot see it
# (docs/guide/export.md, "8-bit weights for CPUs with VNNI").
WEIGHT_BITS = (7, 8)
DEFAULT_WEIGHT_BITS = 7
# How the activations' ranges are chosen from the calibration images: "minmax" (the range
# over all of them: ONNX Runtime's MinMax, NNCF's MINMAX) or "percentile" (ONNX Runtime's
# Percentile; NNCF's MEAN_QUANTILE, the mean of each image's quantiles). export_model keeps
# "minmax": "percentile" gained nothing in ONNX Runtime and cost OpenVINO 2.4 points on the
# Fashion-MNIST net (Lab notes: inference, "int8 accuracy levers").
CALIBRATION_METHODS = ("minmax", "percentile")
DEFAULT_CALIBRATION_METHOD = "minmax"


def check_weight_bits(weight_bits: object, name: str = "weight_bits") -> int:
    """`weight_bits` if it is one of `WEIGHT_BITS`; ValueError naming `name` otherwise."""
    if isinstance(weight_bits, bool) or weight_bits not in WEIGHT_BITS:
        raise ValueError(
            f"`{name}` must be 7 (files right on any CPU) or 8 (files for CPUs with VNNI "
            f"only). Received: {name}={weight_bits!r}"
        )
    return int(weight_bits)


def check_calibration_method(method: object, name: str = "calibration_method") -> str:
    """`method` if it is one of `CALIBRATION_METHODS`; ValueError naming `name` otherwise."""
    if not isinstance(method, str) or method not in CALIBRATION_METHODS:
        raise ValueError(
            f"`{name}` must be one of {CALIBRATION_METHODS}. Received: {name}={method!r}"
        )
    return method


def _check_onnx_path(path):
    """ValueError unless `path` ends in the suffix by which the runner reads an ONNX file
    (`runner.SUFFIXES`), as the int8 check runs it. (An OpenVINO IR is a folder, which the
    runner reads whatever its name.)"""
    if SUFFIXES.get(os.path.splitext(os.fspath(path))[1].lower()) != "onnx":
        raise ValueError(
            "`path`, the int8 ONNX file to write, must end in .onnx, by which `open_runner` "
            f"reads it. Received: path={path!r}"
        )


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI (Linux: an avx512_vnni, avx_vnni or amx_int8 flag in
    /proc/cpuinfo); False where that cannot be read."""
    return bool((cpu_info()[1] or set()) & {"avx512_vnni", "avx_vnni", "amx_int8"})


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


@contextlib.contextmanager
def _no_quantizer_advice():
    """The block without ONNX Runtime's quantizer's warnings, logged on the root logger
    ("Please consider pre-processing before quantization", twice a file): advice for a
    graph of unknown origin, nothing a user of the export can act on."""
    quantizer = os.path.join("onnxruntime", "quantization")

    def advice(record):
        return record.levelno > logging.WARNING or quantizer not in record.pathname

    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


def _check_float_nodes(float_nodes, names, path):
    """`float_nodes` as a list, each name one of the graph's `names`: ONNX Runtime ignores
    an unknown name silently, which would quantize the node the caller meant to keep."""
    if not isinstance(float_nodes, (list, tuple)) or not all(
        isinstance(n, str) for n in float_nodes
    ):
        raise ValueError(
            f"`float_nodes` must be a list of node names. Received: float_nodes={float_nodes!r}"
        )
    unknown = [n for n in float_nodes if n not in names]
    if unknown:
        raise ValueError(
            f"`float_nodes` names nodes that {path} does not have: {unknown}. Its first nodes: "
            f"{list(names)[:5]}. Received: float_nodes={list(float_nodes)!r}"
        )
    return list(float_nodes)


@contextlib.contextmanager
def _percentile_failure(calibration_method):
    """ONNX Runtime's Percentile calibration histograms every activation and fails, with
    numpy's "Too many bins for data range", on one that is constant over the calibration
    images (e.g. a ReLU that never fires): a ValueError that says so."""
    try:
        yield
    except ValueError as error:
        if calibration_method != "percentile" or "bins" not in str(error):
            raise
        raise ValueError(
            "Percentile calibration needs every activation to vary over the calibration "
            "images; an activation is constant on them (ONNX Runtime: "
            f"{error}). Calibrate on other images, or with calibration_method='minmax'. "
            f"Received: calibration_method={calibration_method!r}"
        ) from None


def _joined_ranges(tensors, graph):
    """ONNX Runtime's `TensorQuantOverrides` from its calibrated `TensorsData`: every
    tensor a Concat or a Split joins gets the union of its group's ranges, so that an int8
    Concat copies instead of requantizing each input (0.92-0.94x the int8 file's time on
    ShuffleNet v2 1.0x, no agreement lost on the transfer study's nets: Lab notes:
    inference, "Where ONNX Runtime's int8 time goes")."""
    ranges = {k: v.range_value for k, v in tensors.items()}
    group = {name: name for name in ranges}

    def root(name):
        while group[name] != name:
            name = group[name]
        return name

    for node in graph.node:
        if node.op_type in ("Concat", "Split"):
            joined = [t for t in (*node.input, *node.output) if t in ranges]
            for name in joined[1:]:
                group[root(name)] = root(joined[0])
    members = {}
    for name in ranges:
        members.setdefault(root(name), []).append(name)
    overrides = {}
    for names in (m for m in members.values() if len(m) > 1):
        low = min(float(np.min(ranges[n][0])) for n in names)
        high = max(float(np.max(ranges[n][1])) for n in names)
        bounds = {"rmin": np.float32(low), "rmax": np.float32(high)}
        overrides.update({n: [bounds] for n in names})
    return overrides


def export_onnx_int8(
    float_path: str | os.PathLike,
    path: str | os.PathLike,
    representative_data: np.ndarray,
    quant_format: str = ONNX_QUANT_FORMAT,
    activation_type: str = ONNX_ACTIVATION_TYPE,
    float_nodes: list[str] | tuple[str, ...] = (),
    weight_bits: int = DEFAULT_WEIGHT_BITS,
    calibration_method: str = DEFAULT_CALIBRATION_METHOD,
) -> str | os.PathLike:
    """Writes (atomically) a full-integer ONNX file quantized from the float one.

    Args:
        float_path: the float `model.onnx` written by `export_onnx` (NHWC float32 input).
        path: the int8 `.onnx` file to write.
        representative_data: float32 inputs of the float file's shape, e.g. a few hundred
            training images, run through the float graph to choose the int8 ranges.
        quant_format: "QDQ" (the default) or "QOperator" (QLinearConv).
        activation_type: "QUInt8" (the default) or "QInt8", the activations' type.
        float_nodes: names of ONNX nodes left in float (ONNX Runtime's `nodes_to_exclude`),
            e.g. the first convolution (Lab notes: inference, "What raises int8 agreement").
        weight_bits: 7 (ONNX Runtime's `reduce_range`: right on any CPU) or 8 (only for
            CPUs with VNNI; `WEIGHT_BITS`).
        calibration_method: "minmax" or "percentile" (`CALIBRATION_METHODS`).

    Returns:
        `path`.

    Raises:
        ValueError: `path` does not end in .onnx; `float_nodes` is not a list of names,
            or names a node the float file does not have; `weight_bits` or
            `calibration_method` not one of the choices (nothing is written).
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    _check_onnx_path(path)
    weight_bits = check_weight_bits(weight_bits)
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}[
        check_calibration_method(calibration_method)
    ]

    data = np.asarray(representative_data, dtype="float32")
    graph = onnx.load(str(float_path), load_external_data=False).graph
    excluded = _check_float_nodes(float_nodes, [n.name for n in graph.node], float_path)
    name = onnx_session(str(float_path)).get_inputs()[0].name

    def write(partial):
        # One calibration: the overrides' ranges and (ONNX Runtime's cache) the quantizer's.
        with _no_quantizer_advice(), _percentile_failure(calibration_method):
            with TemporaryDirectory() as tmp:
                calibrator = create_calibrator(
                    str(float_path), augmented_model_path=f"{tmp}/a.onnx", calibrate_method=method
                )
                calibrator.collect_data(_calibration_reader(name, data))
                tensors = calibrator.compute_data()
                save_tensors_data(tensors, f"{tmp}/ranges.json")
                quantize_static(
                    str(float_path),
                    partial,
                    calibration_cache_path=f"{tmp}/ranges.json",
                    quant_format=getattr(QuantFormat, quant_format),
                    per_channel=True,
                    reduce_range=weight_bits == 7,  # 7-bit weights (`WEIGHT_BITS`)
                    calibrate_method=method,
                    activation_type=getattr(QuantType, activation_type),
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=excluded,
                    extra_options={"TensorQuantOverrides": _joined_ranges(tensors, graph)},
                )
        quantized = onnx.load(partial)
        if drop_unread_dequantize(quantized):
            onnx.save(quantized, partial)

    return write_atomically(path, write)


def export_openvino_int8(
    float_path: str | os.PathLike,
    path: str | os.PathLike,
    representative_data: np.ndarray,
    float_nodes: list[str] | tuple[str, ...] = (),
    weight_bits: int = DEFAULT_WEIGHT_BITS,
    calibration_method: str = DEFAULT_CALIBRATION_METHOD,
) -> str | os.PathLike:
    """Writes (atomically) an int8 OpenVINO IR folder by NNCF post-training quantization.

    Args:
        float_path: the float IR folder written by `export_openvino`.
        path: the int8 IR folder to write (`model.xml`, `model.bin`).
        representative_data: float32 inputs, e.g. a few hundred training images.
        float_nodes: names of OpenVINO operations left in float (NNCF's `IgnoredScope`),
            e.g. the first convolution (Lab notes: inference, "What raises int8 agreement").
        weight_bits: 7 (NNCF's overflow fix in every layer: right on any CPU) or 8 (only
            for CPUs with VNNI; `WEIGHT_BITS`).
        calibration_method: "minmax" or "percentile" (`CALIBRATION_METHODS`).

    Returns:
        `path`.

    Raises:
        ValueError: `float_nodes` is not a list of names, or names an operation the float
            IR does not have; `weight_bits` or `calibration_method` not one of the choices
            (nothing is written).
    """
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        OverflowFix,
    )
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    weight_bits = check_weight_bits(weight_bits)
    # "minmax" is the range over all the images, as ONNX Runtime's and LiteRT's: NNCF's
    # own default for activations is MEAN_MINMAX, the mean of each image's range, which
    # clips every image above it (Lab notes: inference, "NNCF's default ranges").
    ranges = {
        "minmax": RangeEstimatorParametersSet.MINMAX,
        "percentile": RangeEstimatorParametersSet.MEAN_QUANTILE,
    }[check_calibration_method(calibration_method)]

    data = np.asarray(representative_data, dtype="float32")
    model = openvino.Core().read_model(os.path.join(float_path, OPENVINO_XML))
    names = [op.get_friendly_name() for op in model.get_ordered_ops()]
    ignored = _check_float_nodes(float_nodes, names, float_path)
    dataset = nncf.Dataset([data[i : i + 1] for i in range(len(data))])
    # 7-bit weights in every layer (NNCF's default: the first only), as ONNX's
    # `reduce_range` (`WEIGHT_BITS`).
    advanced = AdvancedQuantizationParameters(
        overflow_fix=OverflowFix.ENABLE if weight_bits == 7 else OverflowFix.DISABLE,
        activations_range_estimator_params=ranges,
    )

    def write(partial):
        os.makedirs(partial)
        # NNCF draws progress bars ("Statistics collection", "Applying Fast Bias
        # correction") on sys.stdout whatever its log level: off the command's screen.
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(
                model,
                dataset,
                subset_size=len(data),
                advanced_parameters=advanced,
                ignored_scope=nncf.IgnoredScope(names=ignored) if ignored else None,
            )
        openvino.save_model(quantized, os.path.join(partial, OPENVINO_XML), compress_to_fp16=False)

    return write_atomically(path, write)


_WRITERS = {"onnx_int8": export_onnx_int8, "openvino_int8": export_openvino_int8}


def export_int8_file_checked(
    key: str,
    float_path: str,
    path: str,
    calibration: np.ndarray,
    test: tuple[np.ndarray, np.ndarray],
    float_outputs: np.ndarray,
    max_accuracy_drop: float,
    float_nodes: list[str] | tuple[str, ...] = (),
    weight_bits: int = DEFAULT_WEIGHT_BITS,
    calibration_method: str = DEFAULT_CALIBRATION_METHOD,
) -> dict:
    """The int8 ONNX or OpenVINO file quantized from `float_path`, kept only when its
    runtime's accuracy on the test images is within `max_accuracy_drop` of the float
    model's (`int8.write_checked`; OpenVINO runs it with f32 inference precision for the
    parts left in float, whatever the CPU: its default is bf16 on some).

    Args:
        key: "onnx_int8" (`export_onnx_int8`) or "openvino_int8" (`export_openvino_int8`).
        float_path: the float ONNX file or OpenVINO IR folder.
        path: the int8 file (ONNX) or folder (OpenVINO) to write.
        calibration: float32 calibration inputs.
        test: as `int8.write_checked`'s.
        float_outputs: as `int8.write_checked`'s.
        max_accuracy_drop: as `int8.write_checked`'s.
        float_nodes: the writers' (`export_onnx_int8`, `export_openvino_int8`).
        weight_bits: the writers'.
        calibration_method: the writers'.

    Returns:
        The check's entry (`int8.write_checked`'s).

    Raises:
        ValueError: an ONNX `path` that does not end in .onnx (nothing is written).
        Int8CheckError: a drop beyond `max_accuracy_drop` (nothing left at `path`).
    """
    if key == "onnx_int8":  # the writer sees the temporary name: checked here for `path`
        _check_onnx_path(path)
    return write_checked(
        key,
        lambda partial: _WRITERS[key](
            float_path,
            partial,
            calibration,
            float_nodes=float_nodes,
            weight_bits=weight_bits,
            calibration_method=calibration_method,
        ),
        path,
        float_path,
        calibration,
        test,
        float_outputs,
        max_accuracy_drop,
    )
