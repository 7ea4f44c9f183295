"""The one place that runs an exported classifier file, whatever its runtime.

`open_runner(path)` takes a `.keras` file (Keras, `safe_mode=True`), a `.tflite` file
(LiteRT, float or int8), an `.onnx` file (ONNX Runtime) or an OpenVINO IR (`model.xml`, or
its folder; OpenVINO's CPU plugin in float32) and gives a `Runner`: `run(batch)` is the
file's first output on a batch of any size; `input` describes what it takes (shape, dtype,
and the normalisation its own metadata declares); `labels` are the class names its metadata
holds; `size_bytes` and `format` say what it is. Prediction, the fine-tune's evaluation and
latency, the export's parity check and the int8 check all run files through it; a large
batch is fed to the runtime `CHUNK` inputs at a time.

    runner = open_runner("runs/pets/model.tflite", num_threads=1)
    probabilities = runner.run(runner.input.normalize(pixels))  # pixels: (n, h, w, 3)

Each runtime's own errors (a missing runtime, a damaged file) become one ValueError naming
the file.
"""

import dataclasses
import os
import zipfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from keras_autoshuffle._class_names import class_name_problem
from keras_autoshuffle._startup import quiet_runtime
from keras_autoshuffle._validation import one_line
from keras_autoshuffle.export import metadata as metadata_lib
from keras_autoshuffle.export.checks import EXTRAS
from keras_autoshuffle.export.files import keras_outputs, size_bytes
from keras_autoshuffle.export.onnx_runtimes import (
    OPENVINO_PRECISION,
    OPENVINO_XML,
    onnx_session,
    openvino_model,
)

if TYPE_CHECKING:
    from ai_edge_litert.interpreter import Interpreter

# Formats by file suffix; a folder is an OpenVINO IR folder (holding model.xml).
SUFFIXES = {".keras": "keras", ".tflite": "litert", ".onnx": "onnx", ".xml": "openvino"}
# Who runs each format (`checks.EXTRAS`: the extra that installs it; Keras always is).
RUNTIMES = {
    "keras": "Keras",
    "litert": "LiteRT (ai-edge-litert)",
    "onnx": "ONNX Runtime",
    "openvino": "OpenVINO",
}
# The extra that reads a `.tflite` file's metadata.
METADATA_EXTRA = "keras-autoshuffle[mediapipe]"
# The most characters of a runtime's own error quoted in a refusal.
_MAX_REASON = 300
# The most inputs per runtime call: a larger batch (an int8 check's test set) is fed in
# chunks of this many, so memory stays bounded whatever the batch.
CHUNK = 256


def chunked(function: Callable[[np.ndarray], ArrayLike], batch: np.ndarray) -> np.ndarray:
    """`function`'s outputs on `batch`, fed `CHUNK` inputs at a time and concatenated; one
    call at least (an empty batch goes through as it is)."""
    starts = range(0, max(len(batch), 1), CHUNK)
    return np.concatenate([np.asarray(function(batch[i : i + CHUNK])) for i in starts])


@dataclasses.dataclass(frozen=True)
class InputDescription:
    """What an exported file takes.

    Attributes:
        shape: the input's shape without the batch axis, None for a side of any size.
        dtype: the input's NumPy dtype name ("float32"; "uint8" for raw pixels).
        mean: the normalisation's mean on pixel values in [0, 255] (one value, or one per
            channel) as the file's metadata declares it; None where undescribed.
        std: its standard deviation, as many values as `mean`; None where undescribed.
    """

    shape: tuple[int | None, ...]
    dtype: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def normalize(self, pixels: ArrayLike) -> np.ndarray:
        """`(pixels - mean) / std` as float32: RGB pixel values in [0, 255] (channels
        last) as the file takes them.

        Raises:
            ValueError: the file's metadata describes no normalisation.
        """
        if self.mean is None:
            raise ValueError(
                "The file's metadata describes no input normalisation. "
                f"Received: mean={self.mean}, std={self.std}"
            )
        pixels = np.asarray(pixels, "float32")
        return ((pixels - np.float32(self.mean)) / np.float32(self.std)).astype("float32")


@dataclasses.dataclass(frozen=True)
class Runner:
    """An exported file loaded by its runtime (`open_runner`).

    Attributes:
        path: the model file (an OpenVINO IR's `model.xml`).
        format: "keras", "litert", "onnx" or "openvino".
        input: the input's `InputDescription`.
        output_shape: the first output's shape without the batch axis (None: not known
            until run).
        labels: the class names the file's metadata holds, in output order, or None.
        size_bytes: the file's bytes (an OpenVINO IR: its `.xml` and `.bin` files).
    """

    path: str
    format: str
    input: InputDescription
    output_shape: tuple[int | None, ...]
    labels: tuple[str, ...] | None
    size_bytes: int
    _run: Callable[[np.ndarray], np.ndarray] = dataclasses.field(repr=False)

    @property
    def runtime(self) -> str:
        """The runtime's name, for messages."""
        return RUNTIMES[self.format]

    def run(self, batch: ArrayLike) -> np.ndarray:
        """The file's first output on `batch` (any number of inputs, batch first, fed
        `CHUNK` at a time), cast to the input's dtype (float32; whole pixel values to a
        raw-pixel file's uint8, `cast_inputs`).

        Raises:
            ValueError: the runtime fails (naming the file and its reason).
        """
        try:
            return chunked(self._run, np.asarray(batch))
        except Exception as error:  # each runtime raises its own types
            raise ValueError(
                f"{self.path} failed when run by {self.runtime} ({type(error).__name__}: "
                f"{_reason(error)}): a damaged file, or not an export of this package. "
                "Export it again."
            ) from None


def litert_interpreter(
    path: str | os.PathLike,
    batch: int = 1,
    num_threads: int | None = None,
    shape: Sequence[int] | None = None,
) -> "Interpreter":
    """A LiteRT interpreter (ai-edge-litert, XNNPACK delegate) resized to `batch`, or to
    the whole input `shape` (batch first): a file of a model with unknown spatial sizes
    (`input_shape=(None, None, 3)`) holds 1 x 1 placeholders for them."""
    from ai_edge_litert.interpreter import Interpreter

    with quiet_runtime():  # its "Created TensorFlow Lite XNNPACK delegate" line
        interpreter = Interpreter(model_path=path, num_threads=num_threads)
        detail = interpreter.get_input_details()[0]
        wanted = [batch, *detail["shape"][1:]] if shape is None else list(shape)
        if [int(v) for v in detail["shape"]] != [int(v) for v in wanted]:
            interpreter.resize_tensor_input(detail["index"], wanted)
        interpreter.allocate_tensors()
    return interpreter


def cast_inputs(inputs: ArrayLike, dtype: DTypeLike) -> np.ndarray:
    """`inputs` as `dtype`, the input dtype of a file: for an integer dtype (a raw-pixel
    file's uint8) only where every value survives the cast (whole numbers in its range),
    else ValueError naming both dtypes: normalised floats fed to a raw-pixel file would wrap
    into wrong predictions."""
    inputs = np.asarray(inputs)
    dtype = np.dtype(dtype)
    if inputs.dtype == dtype or dtype.kind == "f":
        return inputs.astype(dtype, copy=False)
    cast = inputs.astype(dtype)
    if not np.array_equal(cast, inputs):
        raise ValueError(
            f"The model file takes {dtype} values (raw pixels); these {inputs.dtype} inputs "
            f"are not all whole numbers in its range. Feed decoded pixel values. Received: "
            f"inputs from {inputs.min()} to {inputs.max()}"
        )
    return cast


def locate(path: str | os.PathLike) -> tuple[str, str]:
    """`(format, model file)` of the exported file or OpenVINO IR folder at `path`.

    Raises:
        ValueError: a folder without `model.xml`, an unknown suffix, not a regular file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        xml = os.path.join(path, OPENVINO_XML)
        if not os.path.isfile(xml):
            raise ValueError(
                f"{path} is a folder without {OPENVINO_XML}; give a model file (.keras, "
                f".tflite, .onnx, .xml) or an OpenVINO IR folder. Received: path={path!r}"
            )
        path = xml
    fmt = SUFFIXES.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ValueError(
            f"{path} is no model format this reads: the suffix must be one of "
            f"{', '.join(SUFFIXES)} (or an OpenVINO IR folder). Received: path={path!r}"
        )
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a regular file. Received: path={path!r}")
    return fmt, path


def open_runner(
    path: str | os.PathLike,
    num_threads: int | None = None,
    precision: str = OPENVINO_PRECISION,
) -> Runner:
    """Loads an exported classifier file with its runtime.

    Args:
        path: a `.keras`, `.tflite`, `.onnx` or OpenVINO `.xml` file, or an IR folder.
        num_threads: the runtime's threads (LiteRT, ONNX Runtime intra-op, OpenVINO
            inference threads); None: the runtime's default. Keras ignores it.
        precision: OpenVINO's inference precision ("f32" unless asked).

    Returns:
        The `Runner`.

    Raises:
        ValueError: as `locate`; a runtime that is not installed (naming the extra that
            installs it); a file its runtime cannot load, with more than one input, or
            whose metadata names another count of classes than it has outputs (naming the
            file and the field).
    """
    fmt, model_path = locate(path)
    try:
        run, shape, dtype, output_shape, described = _OPENERS[fmt](
            model_path, num_threads, precision
        )
    except Exception as error:  # each runtime raises its own types for a damaged file
        if isinstance(error, ImportError) and fmt in EXTRAS:  # the runtime is missing
            extra = METADATA_EXTRA if "mediapipe" in str(error) else EXTRAS[fmt]
            raise ValueError(
                f"{model_path} needs {extra}, which is not installed ({one_line(error)}): "
                f'pip install "{extra}". Received: path={os.fspath(path)!r}'
            ) from None
        raise ValueError(
            f"{model_path} cannot be loaded as a model of format {fmt!r} "
            f"({type(error).__name__}: {_reason(error)}). Export it again. "
            f"Received: path={os.fspath(path)!r}"
        ) from None
    labels, mean, std = _checked_metadata(described or {}, model_path)
    classes = output_shape[-1] if output_shape else None
    if labels is not None and classes is not None and len(labels) != classes:
        raise ValueError(
            f"{model_path}: its metadata's field `labels` names {len(labels)} classes but "
            f"the file has {classes} outputs. Received: {len(labels)} labels"
        )
    description = InputDescription(shape, np.dtype(dtype).name, mean, std)
    size = size_bytes(model_path)
    weights = os.path.splitext(model_path)[0] + ".bin"
    if fmt == "openvino" and os.path.isfile(weights):  # the IR's two files, not its folder's
        size += size_bytes(weights)
    return Runner(model_path, fmt, description, output_shape, labels, size, run)


def _checked_metadata(described, model_path):
    """`(labels, mean, std)` of a file's metadata (each None where absent), as tuples; a
    ValueError naming the file and the field for values a tampered file may hold (a string
    of labels, a name with a control character, a std of 0 or of another count than the
    mean: NaN or wrong predictions)."""
    labels, mean, std = (described.get(key) for key in ("labels", "mean", "std"))
    if labels is not None:  # the one rule for a class name (`_class_names`)
        wrong = not isinstance(labels, list) or not all(isinstance(n, str) for n in labels)
        problem = None if wrong else next(filter(None, map(class_name_problem, labels)), None)
        if wrong or problem:
            raise ValueError(
                f"{model_path}: its metadata's field `labels` must be a list of class names"
                + (f": a name {problem}" if problem else "")
                + f". Received: labels={labels!r:.100}"
            )
    labels = None if labels is None else tuple(labels)
    if mean is None and std is None:
        return labels, None, None
    try:
        mean, std = metadata_lib._check_normalization(mean, std, channels=(1, 3))
    except ValueError as error:
        raise ValueError(
            f"{model_path}: its metadata's fields `mean` / `std` (the input's normalisation) "
            f"are not one or three finite numbers each, std > 0. {one_line(error)}"
        ) from None
    return labels, tuple(mean), tuple(std)


def _side(value):
    return int(value) if isinstance(value, (int, np.integer)) and value > 0 else None


def _open_keras(path, num_threads, precision):
    import keras

    if not zipfile.is_zipfile(path):  # else Keras says "File not found" of a file that is
        raise ValueError("not a Keras model file: a .keras file is a zip archive, this is not")
    model = keras.saving.load_model(path, safe_mode=True)
    if not isinstance(model, keras.Model) or len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError("not a Keras model with one input and one output")
    shape = tuple(model.inputs[0].shape[1:])
    return (
        lambda batch: keras_outputs(model, batch.astype("float32", copy=False)),
        shape,
        "float32",
        tuple(model.outputs[0].shape[1:]),
        None,
    )


def _open_litert(path, num_threads, precision):
    interpreter = litert_interpreter(path, num_threads=num_threads)
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    if len(inputs) != 1:
        raise ValueError(f"{len(inputs)} inputs, not one")
    # The signature has -1 for unknown sides (the shape holds 1 x 1 placeholders).
    shape = tuple(_side(v) for v in inputs[0]["shape_signature"][1:])
    current = {"shape": tuple(int(v) for v in inputs[0]["shape"]), "interpreter": interpreter}

    def run(batch):
        if batch.shape != current["shape"]:  # another batch, or an image of another size
            current.update(
                shape=batch.shape,
                interpreter=litert_interpreter(path, num_threads=num_threads, shape=batch.shape),
            )
        interpreter = current["interpreter"]
        interpreter.set_tensor(inputs[0]["index"], cast_inputs(batch, inputs[0]["dtype"]))
        interpreter.invoke()
        return interpreter.get_tensor(outputs[0]["index"])

    output_shape = tuple(_side(v) for v in outputs[0]["shape_signature"][1:])
    return run, shape, inputs[0]["dtype"], output_shape, _litert_metadata(path)


def _litert_metadata(path):
    """`read_litert_metadata`, where the mediapipe extra reads it; None for a file without
    metadata when the extra is missing (an ImportError for a file with some)."""
    try:
        return metadata_lib.read_litert_metadata(path)
    except ImportError:
        with open(path, "rb") as handle:  # the entry's name is in the flatbuffer's strings
            if b"TFLITE_METADATA" in handle.read():
                raise
        return None


def _open_onnx(path, num_threads, precision):
    session = onnx_session(path, num_threads)
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1:
        raise ValueError(f"{len(inputs)} inputs, not one")
    fixed = _side(inputs[0].shape[0])  # a fixed batch (1): one input per call
    dtype = "uint8" if inputs[0].type == "tensor(uint8)" else "float32"

    def call(batch):
        return session.run(None, {inputs[0].name: cast_inputs(batch, dtype)})[0]

    def run(batch):
        if fixed is None or len(batch) == fixed:
            return call(batch)
        return np.concatenate([call(batch[i : i + 1]) for i in range(len(batch))])

    shape = tuple(_side(v) for v in inputs[0].shape[1:])
    output_shape = tuple(_side(v) for v in outputs[0].shape[1:])
    return run, shape, dtype, output_shape, metadata_lib.read_onnx_metadata(path)


def _open_openvino(path, num_threads, precision):
    compiled = {1: openvino_model(path, num_threads, 1, precision)}
    first = compiled[1]
    if len(first.inputs) != 1:
        raise ValueError(f"{len(first.inputs)} inputs, not one")

    def sides(port):
        return tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape()[1:])

    def run(batch):
        if len(batch) not in compiled:  # compiled for each batch size met
            compiled[len(batch)] = openvino_model(path, num_threads, len(batch), precision)
        model = compiled[len(batch)]
        return model(cast_inputs(batch, model.inputs[0].element_type.to_dtype()))[model.outputs[0]]

    # The first output is the classifier's: Keras's OpenVINO exporter leaves a net with
    # unknown sides the scalar shape values of its shuffles as further outputs.
    described = None
    if os.path.basename(path) == OPENVINO_XML:  # the folder `describe_openvino` writes
        described = metadata_lib.read_openvino_metadata(os.path.dirname(path))
    dtype = first.inputs[0].element_type.to_dtype()
    return run, sides(first.inputs[0]), dtype, sides(first.outputs[0]), described


# Each format's opener: `(run, input shape, input dtype, output shape, metadata or None)`,
# the shapes without the batch axis.
_OPENERS = {
    "keras": _open_keras,
    "litert": _open_litert,
    "onnx": _open_onnx,
    "openvino": _open_openvino,
}


def _reason(error, limit=_MAX_REASON):
    """A runtime's error in one line, cut at `limit` characters (Keras's can hold a whole
    model config)."""
    text = one_line(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."
