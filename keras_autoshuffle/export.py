"""Export to `.keras`, SavedModel and LiteRT, each reloaded and checked against Keras.

A model whose shuffles are still relaxed is refused unless asked for: its shuffles
are dense N x N matrices, not the permutations the paper ships. Harden first
(`harden_model` / `HardenShuffles`) and, for speed, fold the permutations into the
weights (`keras_autoshuffle.folding.fold_model`).
"""

import os

import keras
import numpy as np

from keras_autoshuffle.layers import relaxed_shuffles

FORMATS = ("keras", "saved_model", "litert")
FILENAMES = {"keras": "model.keras", "saved_model": "saved_model", "litert": "model.tflite"}


def check_exportable(model, allow_relaxed=False):
    """Raises ValueError if `model` still holds relaxed shuffles (unless allowed)."""
    relaxed = [layer.name for layer in relaxed_shuffles(model)]
    if relaxed and not allow_relaxed:
        raise ValueError(
            f"The model holds {len(relaxed)} relaxed (un-hardened) RelaxedShuffle layers, "
            "whose shuffles are dense matrices, not permutations. Harden them first "
            "(keras_autoshuffle.harden_model or the HardenShuffles callback), or pass "
            f"allow_relaxed=True to export them as they are. Received: relaxed layers={relaxed}"
        )


def _single_input(model, sample_inputs):
    if len(model.inputs) != 1:
        raise ValueError(
            f"Export checks support single-input models. Received: {len(model.inputs)} inputs"
        )
    x = np.asarray(sample_inputs, dtype="float32")
    expected = tuple(model.inputs[0].shape[1:])
    if x.ndim != len(expected) + 1 or any(
        e is not None and e != s for e, s in zip(expected, x.shape[1:], strict=True)
    ):
        raise ValueError(
            f"`sample_inputs` must be a batch of shape (batch, *{expected}). "
            f"Received: sample_inputs.shape={x.shape}"
        )
    if x.shape[0] == 0:
        # No outputs to compare: every format would pass with max_abs_diff 0.0.
        raise ValueError(
            "`sample_inputs` must hold at least one example for the parity check. "
            f"Received: sample_inputs.shape={x.shape}"
        )
    return x


def _max_abs_diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"Output shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def keras_outputs(model, inputs):
    """The model's inference outputs as a NumPy array."""
    return keras.ops.convert_to_numpy(model(inputs, training=False))


def save_keras(model, path):
    """Saves `model` as a `.keras` file for deployment, without training state.

    Keras 3 writes a compiled model's optimizer into `.keras` files (`include_optimizer`
    is ignored there), and a hardened model's optimizer still holds slots for the removed
    shuffle matrices, so loading would warn about skipped variables. An uncompiled copy
    with the same config and weights is saved instead.
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    copy.save(path)
    return path


def load_keras_outputs(path, inputs):
    """Loads a `.keras` file with `safe_mode=True` and runs it on `inputs`."""
    return keras_outputs(keras.saving.load_model(path, safe_mode=True), inputs)


def export_saved_model(model, path):
    """Writes a TF SavedModel (endpoint `serve`) with `model.export`; returns the path."""
    model.export(path, format="tf_saved_model", verbose=False)
    return path


def saved_model_outputs(path, inputs):
    """Loads a SavedModel with `tf.saved_model.load` and runs its `serve` endpoint."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path)  # keep a reference: its variables live in it
    return np.asarray(loaded.serve(tf.constant(inputs)))


def export_litert(model, path):
    """Writes a LiteRT (`.tflite`) flat buffer with `model.export(format="litert")`."""
    model.export(path, format="litert", verbose=False)
    return path


def litert_interpreter(path, batch=1, num_threads=None):
    """A LiteRT interpreter (ai-edge-litert, XNNPACK delegate) resized to `batch`."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=num_threads)
    detail = interpreter.get_input_details()[0]
    if int(detail["shape"][0]) != batch:
        interpreter.resize_tensor_input(detail["index"], [batch, *detail["shape"][1:]])
    interpreter.allocate_tensors()
    return interpreter


def litert_run(interpreter, inputs):
    """Runs a single-input, single-output LiteRT interpreter on `inputs`."""
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], inputs)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def litert_outputs(path, inputs, num_threads=None):
    """Loads a `.tflite` file with the LiteRT runtime and runs it on `inputs`."""
    inputs = np.asarray(inputs, dtype="float32")
    return litert_run(litert_interpreter(path, inputs.shape[0], num_threads), inputs)


_WRITERS = {"keras": save_keras, "saved_model": export_saved_model, "litert": export_litert}
_READERS = {
    "keras": load_keras_outputs,
    "saved_model": saved_model_outputs,
    "litert": litert_outputs,
}


def export_model(
    model,
    output_dir,
    sample_inputs,
    formats=FORMATS,
    allow_relaxed=False,
    atol=1e-4,
    rtol=1e-4,
    reference=None,
):
    """Exports `model`, reloads every file and checks its outputs against Keras.

    Writes `model.keras`, `saved_model/` and `model.tflite` (the formats asked for)
    in `output_dir`, loads each back (`.keras` with `safe_mode=True`, SavedModel
    with `tf.saved_model.load`, LiteRT with `ai_edge_litert`) and runs it on
    `sample_inputs`.

    Args:
        model: a single-input Keras model; its shuffles must be hardened (or manual).
        output_dir: directory to write into (created if missing).
        sample_inputs: a batch of inputs for the parity check.
        formats: any of "keras", "saved_model", "litert".
        allow_relaxed: export relaxed shuffles as dense matrices instead of refusing.
        atol, rtol: parity tolerance, `max|y - y_keras| <= atol + rtol * max|y_keras|`;
            a larger difference raises ValueError.
        reference: the Keras model the files are compared with (default `model`), e.g.
            the hardened model when `model` is its folded form.

    Returns:
        `{format: {"path": str, "max_abs_diff": float}}`.
    """
    check_exportable(model, allow_relaxed)
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"`formats` must be a non-empty subset of {FORMATS}. Received: {formats}")
    inputs = _single_input(model, sample_inputs)
    expected = keras_outputs(model if reference is None else reference, inputs)
    tolerance = atol + rtol * float(np.max(np.abs(expected), initial=0.0))
    os.makedirs(output_dir, exist_ok=True)
    results = {}
    for name in formats:
        path = _WRITERS[name](model, os.path.join(output_dir, FILENAMES[name]))
        diff = _max_abs_diff(_READERS[name](path, inputs), expected)
        if not diff <= tolerance:
            raise ValueError(
                f"The {name} export at {path} differs from the Keras model by {diff:.3e} "
                f"(tolerance {tolerance:.3e})."
            )
        results[name] = {"path": path, "max_abs_diff": diff}
    return results
