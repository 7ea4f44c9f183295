"""The formats, `.keras`, SavedModel and LiteRT: writing each file, atomically
(`_atomic`), and reading it back to run it (ONNX and OpenVINO: `onnx_runtimes.py`)."""

import os
import pathlib
import warnings
from typing import Literal

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle.export.litert_graph import one_conv_per_slice
from keras_autoshuffle.layers import relaxed_shuffles

FORMATS = ("keras", "saved_model", "litert", "onnx", "openvino")
# What `export_model` writes unless told: the formats of the core install and `litert`.
DEFAULT_FORMATS = ("keras", "saved_model", "litert")
FILENAMES = {
    "keras": "model.keras",
    "saved_model": "saved_model",
    "litert": "model.tflite",
    "onnx": "model.onnx",  # onnx_runtimes.py
    "openvino": "openvino",  # a folder: model.xml and model.bin
}
# The full-integer files `export_model(quantize="int8")` writes beside them, each quantized
# from a float format: {result key: (float format, file name)}. The LiteRT one keeps the
# key "int8" it had alone.
INT8_FILES = {
    "int8": ("litert", "model_int8.tflite"),
    "onnx_int8": ("onnx", "model_int8.onnx"),
    "openvino_int8": ("openvino", "openvino_int8"),  # a folder, as `openvino`
}
# The int8 LiteRT file's name (INT8_FILES["int8"]).
INT8_FILENAME = "model_int8.tflite"


def size_bytes(path: str | os.PathLike) -> int:
    """Bytes of an exported file, or of the files directly in an exported folder (an
    OpenVINO IR folder: `model.xml`, `model.bin`).

    Args:
        path: the file or folder.

    Returns:
        The size in bytes.
    """
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path)))
    return os.path.getsize(path)


# Formats that cannot hold a relaxed shuffle computed with `forward="hard"`: its nearest
# permutation is a linear assignment on the host at every call (`tf.numpy_function`), which
# a SavedModel stores as a PyFunc op that runs only in the process that wrote it (another
# process: "Could not find callback"; the parity check, in the same process, passes), and
# which OpenVINO's converter cannot convert (PyFuncStateless). `.keras` keeps the layer;
# LiteRT and ONNX fold the assignment of the (constant) matrix into a fixed permutation.
HARD_FORWARD_REFUSED = ("saved_model", "openvino")


def check_no_hard_forward(
    model: keras.Model, name: Literal["keras", "saved_model", "litert", "onnx", "openvino"]
) -> None:
    """ValueError, before anything is written, if format `name` (one of
    `HARD_FORWARD_REFUSED`) cannot hold `model`'s hard-forward relaxed shuffles."""
    hard = [s.name for s in relaxed_shuffles(model) if getattr(s, "forward_pass", "") == "hard"]
    if hard and name in HARD_FORWARD_REFUSED:
        raise ValueError(
            f"The {name} export cannot hold relaxed shuffles computed with forward='hard' "
            "(a linear assignment run by Python at every call: "
            + (
                "a SavedModel stores it as a PyFunc that runs only in this process"
                if name == "saved_model"
                else "OpenVINO cannot convert it"
            )
            + "). Harden them first (keras_autoshuffle.harden_model). "
            f"Received: format={name!r} with forward='hard' layers={hard}"
        )


def keras_outputs(model: keras.Model, inputs: ArrayLike) -> np.ndarray:
    """The model's inference outputs as a NumPy array."""
    return keras.ops.convert_to_numpy(model(inputs, training=False))


def save_keras(model: keras.Model, path: str | os.PathLike) -> str | os.PathLike:
    """Saves `model` as a `.keras` file for deployment, without training state.

    Keras 3 writes a compiled model's optimizer into `.keras` files (`include_optimizer`
    is ignored there), and a hardened model's optimizer still holds slots for the removed
    shuffle matrices, so loading would warn about skipped variables. An uncompiled copy
    with the same config and weights is saved instead.
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return write_atomically(path, copy.save)


def export_saved_model(model: keras.Model, path: str | os.PathLike) -> str | os.PathLike:
    """Writes a TF SavedModel (endpoint `serve`) with `model.export`; returns the path."""
    check_no_hard_forward(model, "saved_model")
    return write_atomically(
        path, lambda partial: model.export(partial, format="tf_saved_model", verbose=False)
    )


def saved_model_outputs(path: str | os.PathLike, inputs: ArrayLike) -> np.ndarray:
    """Loads a SavedModel with `tf.saved_model.load` and runs its `serve` endpoint."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path)  # keep a reference: its variables live in it
    return np.asarray(loaded.serve(tf.constant(inputs)))


def export_litert(model: keras.Model, path: str | os.PathLike) -> str | os.PathLike:
    """Writes a LiteRT (`.tflite`) flat buffer (`litert_flatbuffer`), a folded net's sliced
    convolutions written as one conv per slice (`litert_graph.one_conv_per_slice`: about
    3.5% faster in XNNPACK than the slices)."""
    content = litert_flatbuffer(one_conv_per_slice(model))
    return write_atomically(path, lambda partial: pathlib.Path(partial).write_bytes(content))


def litert_flatbuffer(model: keras.Model, **settings) -> bytes:
    """`model`'s LiteRT flat buffer: its inference call traced for its one input (any
    batch size), the variables frozen to constants, converted with `settings` (attributes
    of `tf.lite.TFLiteConverter`: `optimizations`, `representative_dataset`, ...).

    The file Keras's `model.export(format="litert")` writes (the same operators, the
    same `serving_default` signature), without the SavedModel Keras writes and the
    converter reads back first: a 1.0x ShuffleNet v2 converts in 7 s instead of 44.
    Needs the `litert` extra (`ai_edge_litert`, which writes the signature).
    """
    import tensorflow as tf

    (source,) = model.inputs
    spec = tf.TensorSpec((None, *source.shape[1:]), source.dtype)
    call = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([call], model)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    # Frozen, no SavedModel round trip (left on, this route keeps the variables as
    # resources the file cannot initialise: NaN outputs).
    for name, value in {"experimental_lower_to_saved_model": False, **settings}.items():
        getattr(converter, name)  # an AttributeError, not a setting silently ignored
        setattr(converter, name, value)
    with warnings.catch_warnings():
        # The frozen graph's int8 conversion asks for input statistics that only an int8
        # input would need; the file's input stays float32 (as Keras's file), quantized inside.
        warnings.filterwarnings("ignore", "Statistics for quantized inputs", UserWarning)
        content = converter.convert()
    return _with_signature(content, source.name)


def _with_signature(content, input_name):
    """The flat buffer with Keras's `serving_default` signature (its input named as the
    Keras input, its output `output_0`), which a frozen graph's conversion leaves out:
    `Interpreter.get_signature_runner()` and LiteRT's `runSignature` use it."""
    try:
        from ai_edge_litert import schema_py_generated as schema_fb
        from ai_edge_litert.tools import flatbuffer_utils
    except ImportError:
        raise ImportError(
            "LiteRT export needs ai_edge_litert (pip install 'keras-autoshuffle[litert]')"
        ) from None

    def tensor(name, index):
        entry = schema_fb.TensorMapT()
        entry.name, entry.tensorIndex = name, int(index)
        return [entry]

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    graph = model.subgraphs[0]  # the main graph (a WHILE loop's body is another)
    signature = schema_fb.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = "serving_default", 0
    signature.inputs = tensor(input_name, graph.inputs[0])
    signature.outputs = tensor("output_0", graph.outputs[0])
    model.signatureDefs = [signature]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))
