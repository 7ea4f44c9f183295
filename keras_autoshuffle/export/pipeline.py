"""`export_model`: the checks, every format written, reloaded and compared with Keras
(the parity check), then the int8 files and their checks."""

import os
from collections.abc import Sequence

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import remove_written
from keras_autoshuffle.export import (
    checks,
    files,
    int8,
    int8_runtimes,
    litert_graph,
    onnx_runtimes,
    runner,
)
from keras_autoshuffle.layers import relaxed_shuffles

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


def _file_outputs(name, path, inputs):
    """The file of format `name` at `path` read back and run on `inputs`: a SavedModel by
    TensorFlow, the others by the one place that runs an exported file (`open_runner`)."""
    if name == "saved_model":
        return files.saved_model_outputs(path, inputs)
    return runner.open_runner(path).run(inputs)


def export_model(
    model: keras.Model,
    output_dir: str | os.PathLike,
    sample_inputs: ArrayLike,
    formats: Sequence[str] = files.DEFAULT_FORMATS,
    allow_relaxed: bool = False,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    reference: keras.Model | None = None,
    quantize: str | None = None,
    representative_data: ArrayLike | None = None,
    test_data: tuple[ArrayLike, ArrayLike] | None = None,
    max_accuracy_drop: float = int8.MAX_ACCURACY_DROP,
    int8_formats: Sequence[str] | None = None,
    int8_weight_bits: int = int8_runtimes.DEFAULT_WEIGHT_BITS,
) -> dict[str, dict]:
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
        atol: parity tolerance, absolute: `max|y - y_keras| <= atol + rtol *
            max|y_keras|`; a larger difference raises ValueError; a finite number >= 0.
        rtol: parity tolerance, relative to `max|y_keras|`; a finite number >= 0. For a
            model computing in 16-bit floats (mixed precision) it is at least twice that
            dtype's epsilon: the exported graph may round in another order (measured:
            2e-3 in bfloat16).
        reference: the Keras model the files are compared with (default `model`), e.g.
            the hardened model when `model` is its folded form.
        quantize: None, or "int8" to also write a full-integer file (int8 weights and
            activations, float32 inputs and outputs) of each float format of
            `int8_formats`: `model_int8.tflite` (LiteRT, `export_int8`),
            `model_int8.onnx` (ONNX Runtime's `quantize_static`) and `openvino_int8/`
            (NNCF; needs the `openvino-int8` extra), all calibrated on
            `representative_data`. Each is checked not by a tolerance on its outputs but
            by its accuracy on `test_data` against `reference`'s (the float Keras model):
            a drop beyond `max_accuracy_drop` raises `Int8CheckError` (a ValueError, its
            `key` naming the file) with the numbers, and no int8 file is left in
            `output_dir` (the float files stay). Top-1 agreement with `reference` is
            measured and returned, not a condition. With None, the int8 files an
            earlier export left in `output_dir` are removed.
        representative_data: with "int8", a batch of inputs to calibrate on (training
            images, a few hundred suffice).
        test_data: with "int8", `(images, labels)`: labelled examples (integer labels).
        max_accuracy_drop: with "int8", the most the int8 accuracy on `test_data` may be
            below the float model's, in percentage points, a number in [0, 100] (100:
            never refused). One image of `test_data` weighs `100 / len(labels)` points.
            The default, 2.0, is argued from measured drops in the guide (Export and
            int8).
        int8_formats: with "int8", the float formats to quantize, each in `formats`
            (default: every one of "litert", "onnx", "openvino" in `formats`).
        int8_weight_bits: with "int8", the ONNX and OpenVINO files' weight bits: 7 (the
            default: right on every x86 CPU) or 8 (more accurate, but only for CPUs with
            VNNI: without it the file can lose accuracy where the check cannot see it;
            `int8_runtimes.WEIGHT_BITS`). LiteRT's weights are always 8-bit.

    Returns:
        `{format: {"path": str, "max_abs_diff": float}}`, and with "int8" an entry per
            int8 file, keyed "int8" (LiteRT), "onnx_int8", "openvino_int8": `{"accuracy",
            "float_accuracy", "accuracy_drop"` (points)`, "top1_agreement",
            "max_accuracy_drop", "size_ratio"` (float bytes / int8 bytes)`, "path",
            "bytes", "float_bytes", "test_examples", "calibration_examples"}`.

    Raises:
        ValueError: a bad argument, before anything is written, or a file that fails its
            parity check.
        Int8CheckError: an int8 file whose accuracy drop is beyond `max_accuracy_drop`.
    """
    formats = _check_args(model, formats, allow_relaxed, quantize, representative_data, test_data)
    int8_formats = _check_int8_formats(formats, quantize, int8_formats)
    atol = _validation.non_negative_float(atol, "atol")
    rtol = _validation.non_negative_float(rtol, "rtol")
    max_accuracy_drop = _validation.percentage_points(max_accuracy_drop, "max_accuracy_drop")
    inputs = checks._single_input(model, sample_inputs)
    reference = _check_reference(model, reference)
    int8_data = _int8_data(model, quantize, representative_data, test_data, max_accuracy_drop)
    int8_options = {
        "weight_bits": int8_runtimes.check_weight_bits(int8_weight_bits, "int8_weight_bits")
    }
    expected = _expected_outputs(model, reference, inputs)
    tolerance = _tolerance(model, expected, atol, rtol)
    _prepare_folder(output_dir, formats, int8_formats, inputs, expected, tolerance)
    # The float and int8 LiteRT files are written from one rewritten graph: their writers
    # find nothing left to rewrite in it (`litert_graph.one_conv_per_slice`).
    litert_model = litert_graph.one_conv_per_slice(model) if "litert" in formats else model
    results = {}
    try:
        for name in formats:
            written = litert_model if name == "litert" else model
            results[name] = _write_and_compare(
                written, name, output_dir, inputs, expected, tolerance
            )
        if int8_formats:
            results.update(
                _write_int8(
                    litert_model,
                    reference,
                    output_dir,
                    results,
                    int8_formats,
                    int8_data,
                    int8_options,
                )
            )
    except BaseException:
        # The failed file, and an earlier export's files of the formats not reached: none
        # of them is known to match the files this call wrote. The int8 files go as one:
        # a folder holds all the int8 files asked for, or none.
        for name in formats:
            if name not in results:
                remove_written(os.path.join(output_dir, files.FILENAMES[name]))
        for _, filename in files.INT8_FILES.values():
            remove_written(os.path.join(output_dir, filename))
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
    _validation.boolean(allow_relaxed, "allow_relaxed")
    checks.check_exportable(model, allow_relaxed)
    formats = checks.check_formats(formats)
    if len(set(formats)) != len(formats):
        raise ValueError(f"`formats` must not repeat a format. Received: formats={formats}")
    for name in formats:  # relaxed shuffles of forward="hard" in SavedModel or OpenVINO
        files.check_no_hard_forward(model, name)
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
    relaxed = [layer.name for layer in relaxed_shuffles(model)]
    if quantize is not None and relaxed:
        raise ValueError(
            'quantize="int8" quantizes a network of exact permutations; this one holds '
            f"{len(relaxed)} relaxed (un-hardened) shuffles. Harden them first "
            "(keras_autoshuffle.harden_model or the HardenShuffles callback). "
            f"Received: relaxed layers={relaxed}"
        )
    if quantize is None and (representative_data is not None or test_data is not None):
        raise ValueError(
            '`representative_data` and `test_data` are for quantize="int8". Received: '
            f"quantize=None with representative_data={type(representative_data).__name__}, "
            f"test_data={type(test_data).__name__}"
        )
    return formats


def _check_int8_formats(formats, quantize, int8_formats):
    """The float formats to quantize: () without "int8"; else `int8_formats` (default:
    those of "litert", "onnx", "openvino" in `formats`), each in `formats` and with its
    quantizer installed (`checks.unsupported_int8`); ValueError otherwise."""
    if quantize != "int8":
        if int8_formats is not None:
            raise ValueError(
                '`int8_formats` is for quantize="int8". Received: quantize=None with '
                f"int8_formats={int8_formats!r}"
            )
        return ()
    quantizable = tuple(fmt for fmt, _ in files.INT8_FILES.values())
    if int8_formats is None:
        int8_formats = tuple(f for f in formats if f in quantizable)
    elif isinstance(int8_formats, str) or not all(isinstance(f, str) for f in int8_formats):
        raise ValueError(
            f"`int8_formats` must be a list of formats of {quantizable}. "
            f"Received: int8_formats={int8_formats!r}"
        )
    int8_formats = tuple(int8_formats)
    wrong = [f for f in int8_formats if f not in quantizable or f not in formats]
    if wrong or not int8_formats:
        raise ValueError(
            f'quantize="int8" quantizes the float files of {quantizable} that the export '
            f"writes: `int8_formats` must be some of them, each in `formats`. Received: "
            f"int8_formats={int8_formats}, formats={formats}"
        )
    unsupported = checks.unsupported_int8(int8_formats)
    if unsupported:
        raise ValueError(
            "These int8 files cannot be written here: "
            + "; ".join(f"{name}: {why}" for name, why in unsupported.items())
            + f". Received: int8_formats={int8_formats}"
        )
    return int8_formats


def _int8_data(model, quantize, representative_data, test_data, max_accuracy_drop):
    """With "int8", the checked `(calibration, (images, labels), max_accuracy_drop)`; None
    without."""
    if quantize != "int8":
        return None
    checked = int8._check_int8_arguments(model, representative_data, test_data)
    return checked[0], checked[1:], max_accuracy_drop


def _prepare_folder(output_dir, formats, int8_formats, inputs, expected, tolerance):
    """Creates `output_dir`; refuses a user's own file at a name the export writes
    (`checks.foreign_files`); removes what an earlier export left there that does not
    match this one: an int8 file not quantized now, and a file of a format not in
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
        if name in files.INT8_FILES:
            if files.INT8_FILES[name][0] not in int8_formats:
                remove_written(path)
        elif name not in formats and not _still_matches(name, path, inputs, expected, tolerance):
            remove_written(path)


def _still_matches(name, path, inputs, expected, tolerance):
    """Whether an earlier export's file of format `name` at `path` can be read here and
    computes `expected` on `inputs` within `tolerance`."""
    if not os.path.lexists(path) or checks.unsupported_formats((name,)):
        return False
    try:
        return _max_abs_diff(_file_outputs(name, path, inputs), expected) <= tolerance
    except Exception:  # unreadable, or of another input shape: not this export's
        return False


def _tolerance(model, expected, atol, rtol):
    """`atol + rtol * max|expected|`, `rtol` at least twice the epsilon of a 16-bit
    compute dtype of `model` (mixed precision)."""
    for dtype in checks.compute_dtypes(model) & set(_EPSILON):
        rtol = max(rtol, 2 * _EPSILON[dtype])
    return atol + rtol * float(np.max(np.abs(expected), initial=0.0))


def _write_int8(model, reference, output_dir, results, int8_formats, int8_data, int8_options):
    """Writes and checks the int8 file of each format of `int8_formats`, quantized from
    the float file in `results` (LiteRT: converted from `model`, the graph the float LiteRT
    file was written from; ONNX and OpenVINO with
    `int8_options`) and calibrated and tested on `int8_data` against `reference`: {int8
    key: its entry}."""
    calibration, test, max_accuracy_drop = int8_data
    # Called, not `predict`: that runs under the strategy `reference` was built in, whose
    # multi-worker collectives wait for the workers that do not export (the chief exports
    # alone: `training.loops._export`).
    float_outputs = runner.chunked(lambda batch: files.keras_outputs(reference, batch), test[0])
    written = {}
    for key, (fmt, filename) in files.INT8_FILES.items():
        if fmt not in int8_formats:
            continue
        path = os.path.join(output_dir, filename)
        float_path = results[fmt]["path"]
        if fmt == "litert":
            written[key] = int8._export_int8_checked(
                model, path, float_path, calibration, *test, float_outputs, max_accuracy_drop
            )
        else:
            written[key] = int8_runtimes.export_int8_file_checked(
                key,
                float_path,
                path,
                calibration,
                test,
                float_outputs,
                max_accuracy_drop,
                **int8_options,
            )
    return written


def _write_and_compare(model, name, output_dir, inputs, expected, tolerance):
    """Writes format `name` into `output_dir`, reads it back and runs it on `inputs`:
    `{"path", "max_abs_diff"}`, or ValueError beyond `tolerance` of `expected`."""
    path = _WRITERS[name](model, os.path.join(output_dir, files.FILENAMES[name]))
    diff = _max_abs_diff(_file_outputs(name, path, inputs), expected)
    if not diff <= tolerance:
        raise ValueError(
            f"The {name} export at {path} differs from the Keras model by {diff:.3e} "
            f"(tolerance {tolerance:.3e}); the file is removed."
        )
    return {"path": path, "max_abs_diff": diff}
