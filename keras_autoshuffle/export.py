"""Export to `.keras`, SavedModel and LiteRT, each reloaded and checked against Keras.

A model whose shuffles are still relaxed is refused unless asked for: its shuffles
are dense N x N matrices, not the permutations the paper ships. Harden first
(`harden_model` / `HardenShuffles`) and, for speed, fold the permutations into the
weights (`keras_autoshuffle.folding.fold_model`).

Every file is written under a temporary name and moved into place (`_atomic`): a killed
export leaves the previous file or the new one, never a truncated one.
"""

import importlib.util
import os

import keras
import numpy as np

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle.layers import relaxed_shuffles

FORMATS = ("keras", "saved_model", "litert")
FILENAMES = {"keras": "model.keras", "saved_model": "saved_model", "litert": "model.tflite"}
# Machine epsilon of the 16-bit compute dtypes of mixed precision.
_EPSILON = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def check_formats(formats):
    """`formats` as a tuple: a non-empty subset of FORMATS (a string is one format)."""
    try:
        checked = (formats,) if isinstance(formats, str) else tuple(formats)
    except TypeError:
        checked = ()
    if not checked or any(not isinstance(f, str) or f not in FORMATS for f in checked):
        raise ValueError(
            f"`formats` must be a non-empty subset of {FORMATS}. Received: formats={formats!r}"
        )
    return checked


def _installed(module):
    return importlib.util.find_spec(module) is not None


def unsupported_formats(formats, dtypes=("float32",)):
    """{format: why it cannot be written and checked here} for the formats of `formats`
    this backend, these installed packages and these compute dtypes cannot export.

    Known before any training: SavedModel needs TensorFlow installed (any backend);
    LiteRT needs Keras's TensorFlow backend (its JAX backend refuses), the
    `ai_edge_litert` package for the parity check, and float32 layers (a model
    computing in bfloat16 or float16 converts to TensorFlow "Flex" ops, which LiteRT's
    builtin interpreter lacks: measured with both mixed precision policies).

    Args:
        formats: formats of FORMATS.
        dtypes: the compute dtypes of the model's layers (`compute_dtypes(model)`).
    """
    reasons = {}
    if "saved_model" in formats and not _installed("tensorflow"):
        reasons["saved_model"] = "SavedModel export needs TensorFlow (pip install tensorflow)"
    if "litert" in formats:
        half = sorted(set(dtypes) & {"bfloat16", "float16"})
        if keras.backend.backend() != "tensorflow":
            reasons["litert"] = (
                "LiteRT export needs Keras's TensorFlow backend; this is "
                f"KERAS_BACKEND={keras.backend.backend()}"
            )
        elif not _installed("ai_edge_litert"):
            reasons["litert"] = "the LiteRT check needs ai_edge_litert (pip install ai-edge-litert)"
        elif half:
            reasons["litert"] = (
                f"a model computing in {half[0]} (mixed precision) converts to TensorFlow Flex "
                "ops, which the LiteRT interpreter lacks; train in float32 to export LiteRT"
            )
    return reasons


def compute_dtypes(model):
    """The set of compute dtypes of `model`'s layers (e.g. {"float32", "bfloat16"})."""
    dtypes, layers = set(), [model]
    while layers:
        layer = layers.pop()
        dtypes.add(keras.backend.standardize_dtype(layer.compute_dtype))
        layers.extend(getattr(layer, "layers", []))
    return dtypes


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
    try:
        x = np.asarray(sample_inputs, dtype="float32")
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"`sample_inputs` must be an array of numbers. Received: {str(error)[:200]}"
        ) from None
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
    if not np.all(np.isfinite(x)):
        # NaN outputs compare as NaN: the parity check could not tell a broken file.
        raise ValueError(
            "`sample_inputs` must hold only finite values for the parity check. Received: "
            f"{int(np.size(x) - np.isfinite(x).sum())} non-finite values of {np.size(x)}"
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
    return write_atomically(path, copy.save)


def load_keras_outputs(path, inputs):
    """Loads a `.keras` file with `safe_mode=True` and runs it on `inputs`."""
    return keras_outputs(keras.saving.load_model(path, safe_mode=True), inputs)


def export_saved_model(model, path):
    """Writes a TF SavedModel (endpoint `serve`) with `model.export`; returns the path."""
    return write_atomically(
        path, lambda partial: model.export(partial, format="tf_saved_model", verbose=False)
    )


def saved_model_outputs(path, inputs):
    """Loads a SavedModel with `tf.saved_model.load` and runs its `serve` endpoint."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path)  # keep a reference: its variables live in it
    return np.asarray(loaded.serve(tf.constant(inputs)))


def export_litert(model, path):
    """Writes a LiteRT (`.tflite`) flat buffer with `model.export(format="litert")`."""
    return write_atomically(
        path, lambda partial: model.export(partial, format="litert", verbose=False)
    )


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

    Writes `model.keras`, `saved_model/` and `model.tflite` (the formats asked for,
    each atomically) in `output_dir`, loads each back (`.keras` with `safe_mode=True`, SavedModel
    with `tf.saved_model.load`, LiteRT with `ai_edge_litert`) and runs it on
    `sample_inputs`.

    Args:
        model: a single-input Keras model; its shuffles must be hardened (or manual).
        output_dir: directory to write into (created if missing).
        sample_inputs: a batch of inputs for the parity check.
        formats: any of "keras", "saved_model", "litert"; one this backend, these
            packages or the model's dtypes cannot give is refused before anything is
            written (`unsupported_formats`).
        allow_relaxed: export relaxed shuffles as dense matrices instead of refusing.
        atol, rtol: parity tolerance, `max|y - y_keras| <= atol + rtol * max|y_keras|`;
            a larger difference raises ValueError. For a model computing in 16-bit
            floats (mixed precision) `rtol` is at least twice that dtype's epsilon: the
            exported graph may round in another order (measured: 2e-3 in bfloat16).
        reference: the Keras model the files are compared with (default `model`), e.g.
            the hardened model when `model` is its folded form.

    Returns:
        `{format: {"path": str, "max_abs_diff": float}}`.
    """
    check_exportable(model, allow_relaxed)
    formats = check_formats(formats)
    unsupported = unsupported_formats(formats, compute_dtypes(model))
    if unsupported:
        raise ValueError(
            "These export formats cannot be written here: "
            + "; ".join(f"{name}: {why}" for name, why in unsupported.items())
            + f". Received: formats={formats}"
        )
    inputs = _single_input(model, sample_inputs)
    expected = keras_outputs(model if reference is None else reference, inputs)
    for dtype in compute_dtypes(model) & set(_EPSILON):
        rtol = max(rtol, 2 * _EPSILON[dtype])
    tolerance = atol + rtol * float(np.max(np.abs(expected), initial=0.0))
    make_folder(output_dir, "output_dir")
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


def make_folder(path, name):
    """Creates the folder `path` (and its parents); a clear error naming `name` when it is
    a file or cannot be created."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"`{name}` must be a folder, not a file. Received: {name}={path!r}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"`{name}` cannot be created ({error.strerror}). Received: {name}={path!r}"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"`{name}` is not writable. Received: {name}={path!r}")
    return path
