"""Running `.tflite` files with the LiteRT interpreter (ai-edge-litert), and predicting a
test set in batches with it or with Keras."""

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import keras
import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from keras_autoshuffle._startup import quiet_runtime
from keras_autoshuffle.export.files import keras_outputs

if TYPE_CHECKING:
    from ai_edge_litert.interpreter import Interpreter

# Examples per interpreter call and per Keras call when predicting a test set.
_PREDICT_BATCH = 256


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


def litert_run(interpreter: "Interpreter", inputs: ArrayLike) -> np.ndarray:
    """Runs a single-input, single-output LiteRT interpreter on `inputs`, cast to the
    input's dtype (float32 pixel values to a raw-pixel file's uint8: exact for whole
    numbers in [0, 255])."""
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(detail["index"], cast_inputs(inputs, detail["dtype"]))
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def litert_outputs(
    path: str | os.PathLike, inputs: ArrayLike, num_threads: int | None = None
) -> np.ndarray:
    """Loads a `.tflite` file with the LiteRT runtime and runs it on `inputs`."""
    inputs = np.asarray(inputs, dtype="float32")
    return litert_run(
        litert_interpreter(path, inputs.shape[0], num_threads, shape=inputs.shape), inputs
    )


def litert_predict(
    path: str | os.PathLike,
    images: ArrayLike,
    batch: int = _PREDICT_BATCH,
    num_threads: int | None = None,
) -> np.ndarray:
    """A `.tflite` file's outputs on `images`, run `batch` examples at a time."""
    images = np.asarray(images, dtype="float32")
    outputs, interpreters = [], {}
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        if chunk.shape not in interpreters:
            interpreters[chunk.shape] = litert_interpreter(
                path, len(chunk), num_threads, shape=chunk.shape
            )
        outputs.append(litert_run(interpreters[chunk.shape], chunk))
    return np.concatenate(outputs)


def keras_predict(
    model: keras.Model, images: np.ndarray, batch: int = _PREDICT_BATCH
) -> np.ndarray:
    """`keras_outputs` on `images`, `batch` examples at a time."""
    return np.concatenate(
        [keras_outputs(model, images[i : i + batch]) for i in range(0, len(images), batch)]
    )
