"""The ONNX and OpenVINO formats: writing `model.onnx` and `openvino/model.xml` (+ `.bin`),
each atomically, and loading them in ONNX Runtime and OpenVINO (`runner.open_runner` runs
them).

Both are written from `onnx_graph` (the net in NCHW, as torchvision's graphs are) when it
takes every layer of the model, which is the case for this package's ShuffleNet nets;
any other model goes through Keras's own `Model.export(format="onnx" / "openvino")`.
The inputs and outputs are the Keras model's (NHWC images in).
"""

import contextlib
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Literal

import keras
import numpy as np

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle._keras_internals import is_called
from keras_autoshuffle.export.files import check_no_hard_forward
from keras_autoshuffle.export.onnx_graph import onnx_graph, unsupported_layers
from keras_autoshuffle.export.onnx_input import read_input_as_columns

if TYPE_CHECKING:
    import onnxruntime
    import openvino

# Python modules each format needs (`checks.EXTRAS`: the extra that installs them).
MODULES = {"onnx": ("onnx", "onnxruntime", "tf2onnx"), "openvino": ("openvino", "onnx")}
OPENVINO_XML = "model.xml"
# OpenVINO's CPU plugin computes a float32 model in bfloat16 by default on CPUs with
# AVX512_BF16 or AMX (0.5e-3 to 1.8e-2 off a float32 Keras model: no parity check passes
# there). Every compile here names its precision: float32 unless asked for another.
OPENVINO_PRECISIONS = ("f32", "bf16", "f16")
OPENVINO_PRECISION = "f32"
# Channel multiple of the ONNX file's convs (`onnx_align`): ONNX Runtime's blocked kernels.
# The OpenVINO file is not padded (measured slower there).
ONNX_ALIGN = 8


# The side a model with unknown spatial sizes (an `input_shape=(None, None, 3)` feature
# extractor) is built at before Keras's exporters trace it: the file keeps them unknown.
_BUILD_SIDE = 224


def _keras_export(model, path, fmt):
    if not is_called(model):  # Keras's exporters need the model built by a call
        shape = [_BUILD_SIDE if side is None else side for side in model.inputs[0].shape[1:]]
        model(np.zeros((1, *shape), "float32"))
    model.export(path, format=fmt, verbose=False)


@contextlib.contextmanager
def _argv_without_verbose():
    """`sys.argv` without "--verbose" for the block: OpenVINO's converter prints its
    arguments and times ("Model Conversion arguments:", "[ SUCCESS ] Total execution time")
    whenever it is there (`is_verbose` in openvino/tools/ovc/convert_impl.py), as the
    command's own option is (`autoshuffle-finetune --verbose 0`)."""
    saved = sys.argv
    sys.argv = [argument for argument in saved if argument != "--verbose"]
    try:
        yield
    finally:
        sys.argv = saved


def export_onnx(model: keras.Model, path: str | os.PathLike) -> str | os.PathLike:
    """Writes `model` as an ONNX file (opset 17): `onnx_graph`'s NCHW graph, its convs
    padded to multiples of 8 channels (`onnx_align`) and its input read by the first conv
    without a Transpose (`onnx_input`), where it takes every layer, else Keras's
    `Model.export(format="onnx")`. Returns `path`."""
    import onnx

    def write(partial):
        if unsupported_layers(model):
            _keras_export(model, partial, "onnx")
        else:
            proto = onnx_graph(model, align=ONNX_ALIGN)
            read_input_as_columns(proto)
            onnx.checker.check_model(proto)
            onnx.save(proto, partial)

    return write_atomically(path, write)


def onnx_session(
    path: str | os.PathLike, num_threads: int | None = None
) -> "onnxruntime.InferenceSession":
    """An ONNX Runtime CPU session for `path` (`num_threads` intra-op threads)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings such as an unused initializer's
    if num_threads:
        options.intra_op_num_threads = num_threads
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def export_openvino(model: keras.Model, path: str | os.PathLike) -> str | os.PathLike:
    """Writes `model` as an OpenVINO IR folder (`model.xml`, `model.bin`, float32 weights):
    converted from `onnx_graph`'s NCHW graph where it takes every layer, else Keras's
    `Model.export(format="openvino")`. Returns the folder `path`."""
    import onnx
    import openvino

    check_no_hard_forward(model, "openvino")

    def write(partial):
        os.makedirs(partial)
        xml = os.path.join(partial, OPENVINO_XML)
        if unsupported_layers(model):
            with _argv_without_verbose():
                _keras_export(model, xml, "openvino")
            return
        with tempfile.TemporaryDirectory() as scratch, _argv_without_verbose():
            source = os.path.join(scratch, "model.onnx")
            onnx.save(onnx_graph(model), source)
            # Float32 weights: the default fp16 compression fails the parity check.
            openvino.save_model(openvino.convert_model(source), xml, compress_to_fp16=False)

    return write_atomically(path, write)


def openvino_config(
    num_threads: int | None = None, precision: Literal["f32", "bf16", "f16"] = OPENVINO_PRECISION
) -> dict[str, Any]:
    """The CPU plugin's settings: latency hint, `num_threads` inference threads and the
    inference precision `precision` ("f32", the default whatever the CPU; "bf16" or "f16"
    only when asked for: the plugin falls back to f32 where the CPU lacks them)."""
    if not (isinstance(precision, str) and precision in OPENVINO_PRECISIONS):
        raise ValueError(
            f"`precision` must be one of {list(OPENVINO_PRECISIONS)}. "
            f"Received: precision={precision!r}"
        )
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision}
    if num_threads:
        config["INFERENCE_NUM_THREADS"] = num_threads
    return config


def openvino_model(
    path: str | os.PathLike,
    num_threads: int | None = None,
    batch: int = 1,
    precision: Literal["f32", "bf16", "f16"] = OPENVINO_PRECISION,
) -> "openvino.CompiledModel":
    """An OpenVINO model compiled for the CPU from an IR folder (or `.xml` file), its
    input reshaped to `batch`, latency hints (`num_threads` inference threads) and the
    inference precision `precision` (`openvino_config`: float32 unless asked)."""
    import openvino

    config = openvino_config(num_threads, precision)
    xml = os.path.join(path, OPENVINO_XML) if os.path.isdir(path) else path
    core = openvino.Core()
    model = core.read_model(xml)
    shape = model.inputs[0].get_partial_shape()
    shape[0] = batch
    model.reshape({model.inputs[0]: shape})
    return core.compile_model(model, "CPU", config)
