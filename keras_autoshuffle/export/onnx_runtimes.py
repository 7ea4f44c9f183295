"""The ONNX and OpenVINO formats: writing `model.onnx` and `openvino/model.xml` (+ `.bin`),
each atomically, and running them with ONNX Runtime and OpenVINO.

Both are written from `onnx_graph` (the net in NCHW, as torchvision's graphs are) when it
takes every layer of the model, which is the case for this package's ShuffleNet nets;
any other model goes through Keras's own `Model.export(format="onnx" / "openvino")`.
The inputs and outputs are the Keras model's (NHWC images in).
"""

import os
import tempfile

import numpy as np

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle._keras_internals import is_called
from keras_autoshuffle.export.onnx_graph import onnx_graph, unsupported_layers
from keras_autoshuffle.export.onnx_input import read_input_as_columns

# Python modules each format needs, and the extra that installs them.
MODULES = {"onnx": ("onnx", "onnxruntime", "tf2onnx"), "openvino": ("openvino", "onnx")}
EXTRAS = {"onnx": "keras-autoshuffle[onnx]", "openvino": "keras-autoshuffle[openvino]"}
OPENVINO_XML = "model.xml"
# Channel multiple of the ONNX file's convs (`onnx_align`): ONNX Runtime's blocked kernels.
# The OpenVINO file is not padded (measured slower there).
ONNX_ALIGN = 8


def _keras_export(model, path, fmt):
    if not is_called(model):  # Keras's exporters need the model built by a call
        model(np.zeros((1, *model.inputs[0].shape[1:]), "float32"))
    model.export(path, format=fmt, verbose=False)


def export_onnx(model, path):
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


def onnx_session(path, num_threads=None):
    """An ONNX Runtime CPU session for `path` (`num_threads` intra-op threads)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def onnx_run(session, inputs):
    """Runs a single-input, single-output ONNX Runtime session on `inputs`."""
    return session.run(None, {session.get_inputs()[0].name: inputs})[0]


def onnx_outputs(path, inputs, num_threads=None):
    """Loads an ONNX file with ONNX Runtime and runs it on `inputs`."""
    return onnx_run(onnx_session(path, num_threads), np.asarray(inputs, dtype="float32"))


def export_openvino(model, path):
    """Writes `model` as an OpenVINO IR folder (`model.xml`, `model.bin`, float32 weights):
    converted from `onnx_graph`'s NCHW graph where it takes every layer, else Keras's
    `Model.export(format="openvino")`. Returns the folder `path`."""
    import onnx
    import openvino

    def write(partial):
        os.makedirs(partial)
        xml = os.path.join(partial, OPENVINO_XML)
        if unsupported_layers(model):
            _keras_export(model, xml, "openvino")
            return
        with tempfile.TemporaryDirectory() as scratch:
            source = os.path.join(scratch, "model.onnx")
            onnx.save(onnx_graph(model), source)
            # Float32 weights: the default fp16 compression fails the parity check.
            openvino.save_model(openvino.convert_model(source), xml, compress_to_fp16=False)

    return write_atomically(path, write)


def openvino_model(path, num_threads=None, batch=1):
    """An OpenVINO model compiled for the CPU from an IR folder (or `.xml` file), its
    input reshaped to `batch` and latency hints (`num_threads` inference threads)."""
    import openvino

    xml = os.path.join(path, OPENVINO_XML) if os.path.isdir(path) else path
    core = openvino.Core()
    model = core.read_model(xml)
    shape = model.inputs[0].get_partial_shape()
    shape[0] = batch
    model.reshape({model.inputs[0]: shape})
    config = {"PERFORMANCE_HINT": "LATENCY"}
    if num_threads:
        config["INFERENCE_NUM_THREADS"] = num_threads
    return core.compile_model(model, "CPU", config)


def openvino_run(compiled, inputs):
    """Runs a single-input, single-output compiled OpenVINO model on `inputs`."""
    return compiled(inputs)[compiled.outputs[0]]


def openvino_outputs(path, inputs, num_threads=None):
    """Loads an OpenVINO IR folder and runs it on `inputs`."""
    inputs = np.asarray(inputs, dtype="float32")
    return openvino_run(openvino_model(path, num_threads, len(inputs)), inputs)
