"""Export to `.keras`, SavedModel and LiteRT, each reloaded and checked against Keras.

A model whose shuffles are still relaxed is refused unless asked for: its shuffles
are dense N x N matrices, not the permutations the paper ships. Harden first
(`harden_model` / `HardenShuffles`) and, for speed, fold the permutations into the
weights (`keras_autoshuffle.folding.fold_model`).

Every file is written under a temporary name and moved into place (`_atomic`): a killed
export leaves the previous file or the new one, never a truncated one.

`quantize="int8"` adds `model_int8.tflite`, a full-integer LiteRT model calibrated on
`representative_data`, whose check is top-1 agreement with the float model and accuracy on
labelled test data (`export_int8`).
"""

import importlib.util
import os

import keras
import numpy as np

from keras_autoshuffle._atomic import remove, write_atomically
from keras_autoshuffle.layers import relaxed_shuffles

FORMATS = ("keras", "saved_model", "litert")
FILENAMES = {"keras": "model.keras", "saved_model": "saved_model", "litert": "model.tflite"}
INT8_FILENAME = "model_int8.tflite"
QUANTIZE = (None, "int8")
# Examples per interpreter call and per Keras call when predicting a test set.
_PREDICT_BATCH = 256
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


def _single_input(model, sample_inputs, name="sample_inputs", purpose="the parity check"):
    if len(model.inputs) != 1:
        raise ValueError(
            f"Export checks support single-input models. Received: {len(model.inputs)} inputs"
        )
    try:
        x = np.asarray(sample_inputs, dtype="float32")
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"`{name}` must be an array of numbers. Received: {str(error)[:200]}"
        ) from None
    expected = tuple(model.inputs[0].shape[1:])
    if x.ndim != len(expected) + 1 or any(
        e is not None and e != s for e, s in zip(expected, x.shape[1:], strict=True)
    ):
        raise ValueError(
            f"`{name}` must be a batch of shape (batch, *{expected}). "
            f"Received: {name}.shape={x.shape}"
        )
    if x.shape[0] == 0:
        # No outputs to compare: every format would pass with max_abs_diff 0.0.
        raise ValueError(
            f"`{name}` must hold at least one example for {purpose}. "
            f"Received: {name}.shape={x.shape}"
        )
    if not np.all(np.isfinite(x)):
        # NaN outputs compare as NaN: the parity check could not tell a broken file.
        raise ValueError(
            f"`{name}` must hold only finite values for {purpose}. Received: "
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


def litert_predict(path, images, batch=_PREDICT_BATCH, num_threads=None):
    """A `.tflite` file's outputs on `images`, run `batch` examples at a time."""
    images = np.asarray(images, dtype="float32")
    outputs, interpreters = [], {}
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        if len(chunk) not in interpreters:
            interpreters[len(chunk)] = litert_interpreter(path, len(chunk), num_threads)
        outputs.append(litert_run(interpreters[len(chunk)], chunk))
    return np.concatenate(outputs)


def keras_predict(model, images, batch=_PREDICT_BATCH):
    """`keras_outputs` on `images`, `batch` examples at a time."""
    return np.concatenate(
        [keras_outputs(model, images[i : i + batch]) for i in range(0, len(images), batch)]
    )


def export_int8(model, path, representative_data):
    """Writes a full-integer LiteRT model (atomically) calibrated on `representative_data`.

    Weights and activations are int8 (`TFLITE_BUILTINS_INT8` only: a layer without an
    int8 kernel fails the conversion instead of falling back to float); the inputs and
    outputs stay float32: the file quantizes its input and dequantizes its output, so it
    takes the same images as the float model and returns the same kind of outputs.

    Args:
        model: a single-input Keras model (TensorFlow backend), e.g. a folded network.
        path: the `.tflite` file to write.
        representative_data: a float32 batch of inputs, e.g. a few hundred training
            images; each is run through the float graph to choose the int8 ranges.
    """
    import tensorflow as tf

    data = np.asarray(representative_data, dtype="float32")

    def representative_dataset():
        for i in range(len(data)):
            yield [data[i : i + 1]]

    return write_atomically(
        path,
        lambda partial: model.export(
            partial,
            format="litert",
            verbose=False,
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=representative_dataset,
            target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]},
        ),
    )


def _check_int8_arguments(
    model, formats, representative_data, test_data, min_top1_agreement, max_accuracy_drop
):
    """The int8 export's arguments, checked before anything is written:
    (calibration images, test images, test labels)."""
    if "litert" not in formats:
        raise ValueError(
            'quantize="int8" reports its size against the float LiteRT file: keep "litert" '
            f"in `formats`. Received: formats={formats}"
        )
    if representative_data is None:
        raise ValueError(
            'quantize="int8" needs `representative_data`, a batch of inputs (e.g. a few '
            "hundred training images) to calibrate the int8 ranges. "
            "Received: representative_data=None"
        )
    calibration = _single_input(model, representative_data, "representative_data", "calibration")
    if not isinstance(test_data, (tuple, list)) or len(test_data) != 2:
        raise ValueError(
            'quantize="int8" needs `test_data=(images, labels)`, labelled examples to measure '
            "the int8 model's accuracy and top-1 agreement with the float model. "
            f"Received: test_data of type {type(test_data).__name__}"
        )
    images = _single_input(model, test_data[0], "test_data[0]", "the int8 check")
    classes = model.outputs[0].shape[-1]
    try:
        labels = np.asarray(test_data[1])
        valid = labels.dtype.kind in "iu" or (
            labels.dtype.kind == "f" and np.all(np.isfinite(labels) & (labels == np.round(labels)))
        )
    except (TypeError, ValueError):
        labels, valid = np.asarray([]), False
    if not valid or labels.shape != (len(images),) or np.any((labels < 0) | (labels >= classes)):
        raise ValueError(
            f"`test_data[1]` must be {len(images)} integer class labels in [0, {classes}), one "
            f"per image. Received: labels of shape {labels.shape}, dtype {labels.dtype}"
        )
    _fraction(min_top1_agreement, "min_top1_agreement", 1.0)
    _fraction(max_accuracy_drop, "max_accuracy_drop", 100.0)
    return calibration, images, labels.astype("int64")


def _fraction(value, name, top):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        valid = False
    else:
        valid = 0.0 <= float(value) <= top
    if not valid:
        raise ValueError(f"`{name}` must be a number in [0, {top:g}]. Received: {name}={value!r}")


def int8_check(path, float_path, images, labels, float_outputs):
    """The int8 file's report: its accuracy on (`images`, `labels`), the float model's
    (`float_outputs`, its outputs on `images`), their top-1 agreement, and the size ratio
    float LiteRT bytes / int8 bytes."""
    predicted = np.argmax(litert_predict(path, images), axis=-1)
    expected = np.argmax(float_outputs, axis=-1)
    return {
        "accuracy": float(np.mean(predicted == labels)),
        "float_accuracy": float(np.mean(expected == labels)),
        "top1_agreement": float(np.mean(predicted == expected)),
        "size_ratio": os.path.getsize(float_path) / os.path.getsize(path),
        "bytes": os.path.getsize(path),
        "float_bytes": os.path.getsize(float_path),
        "test_examples": len(labels),
        "path": path,
    }


def _export_int8_checked(
    model, path, float_path, calibration, images, labels, float_outputs, min_agreement, max_drop
):
    """`export_int8` whose file is moved into place only when `int8_check` passes the
    thresholds; below them the export is refused and no int8 file is left at `path`."""
    entry = {}

    def write(partial):
        export_int8(model, partial, calibration)
        entry.update(int8_check(partial, float_path, images, labels, float_outputs))
        drop = 100 * (entry["float_accuracy"] - entry["accuracy"])
        if entry["top1_agreement"] < min_agreement or drop > max_drop:
            raise Int8CheckError(
                entry,
                f"The int8 LiteRT model fails its check: top-1 agreement with the float "
                f"model {entry['top1_agreement']:.4f} (minimum {min_agreement}), accuracy "
                f"{entry['accuracy']:.4f} vs float {entry['float_accuracy']:.4f} (drop "
                f"{drop:.2f} points, maximum {max_drop}) on {len(labels)} test examples; no "
                f"{INT8_FILENAME} written. Calibrate on more representative images or lower "
                f"the thresholds. Received: min_top1_agreement={min_agreement}, "
                f"max_accuracy_drop={max_drop}",
            )

    try:
        write_atomically(path, write)
    except Int8CheckError:
        remove(path)  # an earlier export's int8 file would not match the new float files
        raise
    return {**entry, "path": path, "calibration_examples": len(calibration)}


class Int8CheckError(ValueError):
    """The int8 model's top-1 agreement or accuracy is below the export's thresholds;
    `check` holds the measured numbers (`int8_check`'s entry, without a file)."""

    def __init__(self, check, message):
        super().__init__(message)
        self.check = {k: v for k, v in check.items() if k != "path"}


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
    quantize=None,
    representative_data=None,
    test_data=None,
    min_top1_agreement=0.99,
    max_accuracy_drop=0.5,
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
        quantize: None, or "int8" to also write `model_int8.tflite`: full-integer LiteRT
            (int8 weights and activations, float32 inputs and outputs; `export_int8`),
            calibrated on `representative_data`. Needs "litert" in `formats`. Its check
            is not a tolerance on the outputs but top-1 agreement with `reference` (the
            float Keras model) and accuracy on `test_data`; below either threshold the
            export raises `Int8CheckError` (a ValueError) with the numbers and no int8
            file is left in `output_dir` (the float files stay).
        representative_data: with "int8", a batch of inputs to calibrate on (training
            images, a few hundred suffice).
        test_data: with "int8", `(images, labels)`: labelled examples (integer labels).
        min_top1_agreement: with "int8", the least fraction of `test_data` on which the
            int8 and float models predict the same class.
        max_accuracy_drop: with "int8", the most the int8 accuracy on `test_data` may be
            below the float model's, in percentage points.

    Returns:
        `{format: {"path": str, "max_abs_diff": float}}`, and with "int8" an `"int8"`
        entry: `{"accuracy", "float_accuracy", "top1_agreement", "size_ratio"` (float
        LiteRT bytes / int8 bytes)`, "path", "bytes", "float_bytes", "test_examples",
        "calibration_examples"}`.
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
    if not any(quantize is q for q in QUANTIZE):
        raise ValueError(f"`quantize` must be None or 'int8'. Received: quantize={quantize!r}")
    if quantize is None and (representative_data is not None or test_data is not None):
        raise ValueError(
            '`representative_data` and `test_data` are for quantize="int8". Received: '
            f"quantize=None with representative_data={type(representative_data).__name__}, "
            f"test_data={type(test_data).__name__}"
        )
    inputs = _single_input(model, sample_inputs)
    reference = model if reference is None else reference
    if quantize == "int8":
        int8_data = _check_int8_arguments(
            model, formats, representative_data, test_data, min_top1_agreement, max_accuracy_drop
        )
    expected = keras_outputs(reference, inputs)
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
    if quantize == "int8":
        calibration, images, labels = int8_data
        results["int8"] = _export_int8_checked(
            model,
            os.path.join(output_dir, INT8_FILENAME),
            results["litert"]["path"],
            calibration,
            images,
            labels,
            keras_predict(reference, images),
            min_top1_agreement,
            max_accuracy_drop,
        )
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
