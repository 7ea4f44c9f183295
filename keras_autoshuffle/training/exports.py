"""A run's exports: planned and checked before training, written after the hardening.

`train()` refuses before its first epoch what its end could not do (a format this backend
or precision cannot write, int8 without a format to quantize, a model that does not load back
as a `.keras` file), then exports the hardened model through `export.export_model`.
"""

import warnings

import keras
import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle.export import int8_runtimes

# `int8=True`: training images calibrated on, and at most this many test examples checked.
INT8_CALIBRATION_EXAMPLES = 500
INT8_TEST_EXAMPLES = 10000


def export_formats(export):
    """None: every format where possible (`export=True`); else the formats asked for."""
    if export is True:
        return None
    if export is False:
        return ()
    try:
        return export_lib.check_formats(export)
    except ValueError:
        raise ValueError(
            f"`export` must be True, False or a list of formats of {export_lib.FORMATS}. "
            f"Received: export={export!r}"
        ) from None


def plan_export(formats, dtypes, int8=False, received=None):
    """The run's export plan, made before training (and before the data is read, by the
    command line): (formats to write besides `.keras`, {format: why it is left out}).

    Args:
        formats: None for SavedModel and LiteRT where possible (one that is not is left
            out with a warning); else exactly these (one that cannot be written raises
            ValueError).
        dtypes: the model's compute dtypes (`export.compute_dtypes`), or the policy's.
        int8: the int8 files too (`int8_formats`): ValueError where none can be written.
        received: what the error quotes (default: `export=...`).
    """
    auto = formats is None
    formats = ("saved_model", "litert") if auto else tuple(f for f in formats if f != "keras")
    received = received or f"export={formats}"
    unsupported = export_lib.unsupported_formats(formats, dtypes)
    if unsupported and not auto:
        raise ValueError(
            "These export formats cannot be written by this run: "
            + "; ".join(f"{name}: {why}" for name, why in unsupported.items())
            + ". Leave them out (or pass export=True to drop what cannot be exported). "
            f"Received: {received}"
        )
    _validation.choice(int8, (False, True), "int8")
    formats = tuple(f for f in formats if f not in unsupported)
    if int8 and not int8_formats(formats):
        why = unsupported.get("litert", "the run does not export LiteRT (`export`)")
        raise ValueError(
            "`int8=True` needs the LiteRT export (or ONNX's, or OpenVINO's with its "
            f"openvino-int8 extra), which this run cannot write: {why}. "
            f"Received: int8=True with {received}"
        )
    if int8:
        for name, why in export_lib.unsupported_int8(formats).items():
            warnings.warn(f"The run will not write the int8 {name} file: {why}.", stacklevel=3)
    for name, why in unsupported.items():
        warnings.warn(
            f"The run will not export {name}: {why}. (Listed in `export`, a format that cannot "
            "be written stops the run before training instead.)",
            stacklevel=3,
        )
    return formats, unsupported


def int8_formats(formats):
    """The formats of `formats` whose int8 file can be written here (LiteRT, ONNX, and
    OpenVINO where NNCF is installed)."""
    quantizable = [fmt for fmt, _ in export_lib.INT8_FILES.values()]
    unsupported = export_lib.unsupported_int8(formats)
    return tuple(f for f in formats if f in quantizable and f not in unsupported)


def check_calibration_images(train_examples, int8):
    """ValueError where `int8` is asked for but the `train_examples` training images are
    fewer than the int8 calibration takes (`export_model`'s minimum): checked before any
    training, not after it."""
    minimum = export_lib.MIN_CALIBRATION_IMAGES
    if int8 and train_examples < minimum:
        raise ValueError(
            f"`int8=True` calibrates the int8 files on the training images: at least {minimum} "
            "are needed (a few hundred are usual). Leave out int8 or add images. Received: "
            f"{train_examples} training images"
        )


def int8_data(train_data, test_data):
    """(calibration images, (test images, test labels)) for the int8 export."""

    def take(data, count):
        images, labels = [], []
        for batch in data.eval_dataset(256):
            images.append(keras.ops.convert_to_numpy(batch[0]))
            labels.append(keras.ops.convert_to_numpy(batch[1]))
            if sum(len(x) for x in images) >= count:
                break
        return np.concatenate(images)[:count], np.concatenate(labels)[:count]

    calibration, _ = take(train_data, INT8_CALIBRATION_EXAMPLES)
    return calibration, take(test_data, INT8_TEST_EXAMPLES)


def check_savable(model, test_data, formats):
    """Checks before training what the end of the run needs: the model's config loads
    back in safe mode (`model.keras`), and a batch of test images for the export checks
    (returned when exporting)."""
    try:
        config = keras.saving.serialize_keras_object(model)
        keras.saving.deserialize_keras_object(config, safe_mode=True)
    except Exception as error:  # whatever Keras raises: the model cannot be saved as built
        raise ValueError(
            "The model cannot be saved and loaded as a .keras file (register its custom "
            "objects with keras.saving.register_keras_serializable, avoid Lambda layers). "
            f"Received: {type(error).__name__}: {str(error)[:300]}"
        ) from None
    if not formats:
        return None
    return keras.ops.convert_to_numpy(next(iter(test_data.eval_dataset(8)))[0])


def export_run(
    model,
    output_dir,
    sample,
    formats,
    int8_data=None,
    max_accuracy_drop=export_lib.MAX_ACCURACY_DROP,
    int8_weight_bits=int8_runtimes.DEFAULT_WEIGHT_BITS,
    wrap=None,
):
    """`model.keras` as trained (hardened); `formats` (SavedModel, LiteRT, ONNX, OpenVINO)
    from the folded network, and with `int8_data` (calibration images, test data) the int8
    file of each of them that has one (`int8_formats`), refused where its accuracy drop is
    beyond `max_accuracy_drop` points, ONNX's and OpenVINO's weights in `int8_weight_bits`.
    With `wrap` (a function of a model), the files are of `wrap(folded)` checked against
    `wrap(model)`, and no `model.keras` is written.

    Folding (`folding.fold_model`) removes the shuffles' GATHERs, which split LiteRT's
    XNNPACK delegate; models it does not cover (not from `applications`, channels_first)
    are exported as they are. An int8 file refused by its check does not cost the run: the
    export is made again without it, and its entry holds the numbers and why it was refused.
    """
    from keras_autoshuffle import folding

    results = {}
    if wrap is None:
        results = export_lib.export_model(model, output_dir, sample, formats=("keras",))
    folded = folding.is_foldable(model)
    inference = folding.fold_model(model, name=model.name) if folded else model
    if wrap is not None:
        inference, model = wrap(inference), wrap(model)
    quantized = int8_formats(formats) if int8_data is not None else ()
    refused = {}
    while True:
        int8 = {}
        if quantized:
            int8 = dict(
                quantize="int8",
                representative_data=int8_data[0],
                test_data=int8_data[1],
                int8_formats=quantized,
                max_accuracy_drop=max_accuracy_drop,
                int8_weight_bits=int8_weight_bits,
            )
        try:
            files = export_lib.export_model(
                inference, output_dir, sample, formats=formats, reference=model, **int8
            )
            break
        except export_lib.Int8CheckError as error:
            # Training is over: keep the float files and the report, refuse the int8 file.
            refused[error.key] = {**error.check, "path": None, "refused": str(error)}
            fmt = export_lib.INT8_FILES[error.key][0]
            quantized = tuple(f for f in quantized if f != fmt)
    files.update(refused)
    for name, entry in files.items():
        results[name] = {**entry, "folded": folded}
    return results
