"""The LiteRT interpreter (ai-edge-litert) for `.tflite` files; `runner.open_runner` runs
them."""

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keras_autoshuffle._startup import quiet_runtime

if TYPE_CHECKING:
    from ai_edge_litert.interpreter import Interpreter


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
