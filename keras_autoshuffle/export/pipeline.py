"""`export_model`: the checks, every format written, reloaded and compared with Keras
(the parity check), then the int8 file and its check."""

import os

import keras
import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import remove_written
from keras_autoshuffle.export import checks, files, int8, litert, onnx_runtimes

QUANTIZE = (None, "int8")
# Machine epsilon of the 16-bit compute dtypes of mixed precision.
_EPSILON = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def _max_abs_diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"Output shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


_WRITERS = {
    "keras": files.save_keras,
    "saved_model": files.export_saved_model,
    "litert": files.export_litert,
    "onnx": onnx_runtimes.export_onnx,
    "openvino": onnx_runtimes.export_openvino,
}
_READERS = {
    "keras": files.load_keras_outputs,
    "saved_model": files.saved_model_outputs,
    "litert": litert.litert_outputs,
    "onnx": onnx_runtimes.onnx_outputs,
    "openvino": onnx_runtimes.openvino_outputs,
}


def export_model(
    model,
    output_dir,
    sample_inputs,
    formats=files.DEFAULT_FORMATS,
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

    Writes `model.keras`, `saved_model/` and `model.tflite` (by default; with "onnx" and
    "openvino" also `model.onnx` and `openvino/model.xml`), each atomically, in
    `output_dir`, loads each back (`.keras` with `safe_mode=True`, SavedModel with
    `tf.saved_model.load`, LiteRT with `ai_edge_litert`, ONNX with ONNX Runtime, OpenVINO
    with its CPU plugin, in float32) and runs it on `sample_inputs`.

    One folder, one consistent export: every argument is checked before anything is
    written; a file at one of these names (or `model_int8.tflite`) that does not hold what
    the export writes there (a user's own file) is refused, never replaced or removed; an
    earlier export's file of a format this call does not write is kept only where it
    still computes `reference`'s outputs within the tolerance (e.g. the `.keras` file of
    the hardened model beside its folded LiteRT file), else removed; a file that fails its
    check, and the earlier files of the formats not yet written when a format fails, are
    removed (the files this call wrote and checked stay).

    Args:
        model: a single-input Keras model; its shuffles must be hardened (or manual).
        output_dir: directory to write into (created if missing).
        sample_inputs: a batch of inputs for the parity check.
        formats: any of "keras", "saved_model", "litert", "onnx", "openvino" (default the
            first three; ONNX and OpenVINO are written as NCHW graphs, see
            `onnx_runtimes`); one this backend, these
            packages or the model's dtypes cannot give is refused before anything is
            written (`unsupported_formats`).
        allow_relaxed: export relaxed shuffles as dense matrices instead of refusing.
        atol, rtol: parity tolerance, `max|y - y_keras| <= atol + rtol * max|y_keras|`;
            a larger difference raises ValueError; finite numbers >= 0. For a model
            computing in 16-bit floats (mixed precision) `rtol` is at least twice that
            dtype's epsilon: the exported graph may round in another order (measured: 2e-3
            in bfloat16).
        reference: the Keras model the files are compared with (default `model`), e.g.
            the hardened model when `model` is its folded form.
        quantize: None, or "int8" to also write `model_int8.tflite`: full-integer LiteRT
            (int8 weights and activations, float32 inputs and outputs; `export_int8`),
            calibrated on `representative_data`. Needs "litert" in `formats`. Its check
            is not a tolerance on the outputs but top-1 agreement with `reference` (the
            float Keras model) and accuracy on `test_data`; below either threshold the
            export raises `Int8CheckError` (a ValueError) with the numbers and no int8
            file is left in `output_dir` (the float files stay). With None, an int8
            file an earlier export left in `output_dir` is removed.
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
    formats = _check_args(model, formats, allow_relaxed, quantize, representative_data, test_data)
    atol = _validation.non_negative_float(atol, "atol")
    rtol = _validation.non_negative_float(rtol, "rtol")
    int8._fraction(min_top1_agreement, "min_top1_agreement", 1.0)
    int8._fraction(max_accuracy_drop, "max_accuracy_drop", 100.0)
    inputs = checks._single_input(model, sample_inputs)
    reference = _check_reference(model, reference)
    int8_limits = (min_top1_agreement, max_accuracy_drop)
    int8_data = _int8_data(model, formats, quantize, representative_data, test_data, int8_limits)
    expected = _expected_outputs(model, reference, inputs)
    tolerance = _tolerance(model, expected, atol, rtol)
    _prepare_folder(output_dir, formats, quantize, inputs, expected, tolerance)
    results = {}
    try:
        for name in formats:
            results[name] = _write_and_compare(model, name, output_dir, inputs, expected, tolerance)
        if quantize == "int8":
            results["int8"] = _write_int8(
                model, reference, output_dir, results["litert"]["path"], int8_data, int8_limits
            )
    except BaseException:
        # The failed file, and an earlier export's files of the formats not reached: none
        # of them is known to match the files this call wrote.
        for name in formats:
            if name not in results:
                remove_written(os.path.join(output_dir, files.FILENAMES[name]))
        remove_written(os.path.join(output_dir, int8.INT8_FILENAME))
        raise
    return results


def _check_reference(model, reference):
    """`reference` (default `model`): a Keras model with one input."""
    if reference is None:
        return model
    if not isinstance(reference, keras.Model) or len(reference.inputs) != 1:
        raise ValueError(
            "`reference` must be None or a single-input Keras model. "
            f"Received: reference of type {type(reference).__name__}"
        )
    return reference


def _expected_outputs(model, reference, inputs):
    """`reference`'s outputs on `inputs`, checked before anything is written: finite (a NaN
    would fail every parity check after the files are written), and of the shape of
    `model`'s own outputs (a reference of another net)."""
    expected = files.keras_outputs(reference, inputs)
    if reference is not model:
        shape = files.keras_outputs(model, inputs).shape
        if expected.shape != shape:
            raise ValueError(
                "`reference` must compute outputs of the shape of the model's. Received: "
                f"reference outputs of shape {expected.shape}, model outputs of shape {shape}"
            )
    if not np.all(np.isfinite(expected)):
        raise ValueError(
            "The Keras model's outputs on `sample_inputs` are not all finite: no export "
            "could be checked against them. Received: "
            f"{int(np.size(expected) - np.isfinite(expected).sum())} non-finite outputs of "
            f"{np.size(expected)}"
        )
    return expected


def _check_args(model, formats, allow_relaxed, quantize, representative_data, test_data):
    """`formats` checked (as a tuple), after the model's shuffles, what this backend and
    these packages can write, and `quantize` with its data; ValueError otherwise."""
    if not isinstance(allow_relaxed, (bool, np.bool_)):
        raise ValueError(
            f"`allow_relaxed` must be True or False. Received: allow_relaxed={allow_relaxed!r}"
        )
    checks.check_exportable(model, allow_relaxed)
    formats = checks.check_formats(formats)
    if len(set(formats)) != len(formats):
        raise ValueError(f"`formats` must not repeat a format. Received: formats={formats}")
    checks.check_model_formats(model, formats)
    unsupported = checks.unsupported_formats(formats, checks.compute_dtypes(model))
    if unsupported:
        raise ValueError(
            "These export formats cannot be written here: "
            + "; ".join(f"{name}: {why}" for name, why in unsupported.items())
            + f". Received: formats={formats}"
        )
    # Compared by value (a string built at run time is not the literal), strings only.
    if not (quantize is None or (isinstance(quantize, str) and quantize in QUANTIZE)):
        raise ValueError(f"`quantize` must be None or 'int8'. Received: quantize={quantize!r}")
    if quantize is None and (representative_data is not None or test_data is not None):
        raise ValueError(
            '`representative_data` and `test_data` are for quantize="int8". Received: '
            f"quantize=None with representative_data={type(representative_data).__name__}, "
            f"test_data={type(test_data).__name__}"
        )
    return formats


def _int8_data(model, formats, quantize, representative_data, test_data, int8_limits):
    """With "int8", the checked `(calibration, images, labels)`; None without."""
    if quantize != "int8":
        return None
    return int8._check_int8_arguments(model, formats, representative_data, test_data, *int8_limits)


def _prepare_folder(output_dir, formats, quantize, inputs, expected, tolerance):
    """Creates `output_dir`; refuses a user's own file at a name the export writes
    (`checks.foreign_files`); removes what an earlier export left there that does not
    match this one: its int8 file without int8 now, and its file of a format not in
    `formats` unless that file still computes `expected` within `tolerance`."""
    names = checks.export_names()
    if os.path.isdir(output_dir):
        foreign = checks.foreign_files(output_dir, names)
        if foreign:
            raise ValueError(
                f"`output_dir` holds {foreign}, at the names the export writes, but not files "
                "it wrote: they are neither replaced nor removed. Move them or choose another "
                f"folder. Received: output_dir={output_dir!r}"
            )
    checks.make_folder(output_dir, "output_dir")
    for name, filename in names.items():
        path = os.path.join(output_dir, filename)
        if name in formats:
            continue
        if name == "int8":
            if quantize is None:
                remove_written(path)
        elif not _still_matches(name, path, inputs, expected, tolerance):
            remove_written(path)


def _still_matches(name, path, inputs, expected, tolerance):
    """Whether an earlier export's file of format `name` at `path` can be read here and
    computes `expected` on `inputs` within `tolerance`."""
    if not os.path.lexists(path) or checks.unsupported_formats((name,)):
        return False
    try:
        return _max_abs_diff(_READERS[name](path, inputs), expected) <= tolerance
    except Exception:  # unreadable, or of another input shape: not this export's
        return False


def _tolerance(model, expected, atol, rtol):
    """`atol + rtol * max|expected|`, `rtol` at least twice the epsilon of a 16-bit
    compute dtype of `model` (mixed precision)."""
    for dtype in checks.compute_dtypes(model) & set(_EPSILON):
        rtol = max(rtol, 2 * _EPSILON[dtype])
    return atol + rtol * float(np.max(np.abs(expected), initial=0.0))


def _write_int8(model, reference, output_dir, litert_path, int8_data, int8_limits):
    """Writes and checks `model_int8.tflite` (calibrated and tested on `int8_data`) against
    `reference` and the float LiteRT file at `litert_path`, within `int8_limits` (least
    top-1 agreement, most accuracy drop): the int8 entry of the results."""
    calibration, images, labels = int8_data
    return int8._export_int8_checked(
        model,
        os.path.join(output_dir, int8.INT8_FILENAME),
        litert_path,
        calibration,
        images,
        labels,
        litert.keras_predict(reference, images),
        *int8_limits,
    )


def _write_and_compare(model, name, output_dir, inputs, expected, tolerance):
    """Writes format `name` into `output_dir`, reads it back and runs it on `inputs`:
    `{"path", "max_abs_diff"}`, or ValueError beyond `tolerance` of `expected`."""
    path = _WRITERS[name](model, os.path.join(output_dir, files.FILENAMES[name]))
    diff = _max_abs_diff(_READERS[name](path, inputs), expected)
    if not diff <= tolerance:
        raise ValueError(
            f"The {name} export at {path} differs from the Keras model by {diff:.3e} "
            f"(tolerance {tolerance:.3e}); the file is removed."
        )
    return {"path": path, "max_abs_diff": diff}
