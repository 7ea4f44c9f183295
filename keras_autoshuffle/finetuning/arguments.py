"""The checks of `finetune()`'s arguments, its image and output folders, and a recorded
split, before any work (or right after the scan, for what needs the images): each bad value
refused with a one-line error naming it."""

import os
from collections.abc import Sequence
from typing import Any

from keras_autoshuffle import _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle.applications import V2_WIDTHS
from keras_autoshuffle.finetuning.run_folder import RUN_FILES
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError

# What is exported beside model.keras by default, where this install can.
EXPORT_FORMATS = ("litert", "onnx", "openvino")
CLASS_WEIGHTS = ("balanced", None)


def check_arguments(pretrained: bool, **given: Any) -> dict:
    """The arguments, checked and filled with their defaults, before any work."""
    options = dict(given)
    options["width"] = _validation.choice(given["width"], V2_WIDTHS, "width")
    options["image_size"] = _validation.positive_int(given["image_size"], "image_size")
    options["epochs"] = _validation.positive_int(given["epochs"], "epochs")
    head_epochs = given["head_epochs"]
    if head_epochs is None:
        head_epochs = 3 if pretrained else 0
    options["head_epochs"] = _validation.non_negative_int(head_epochs, "head_epochs")
    if options["head_epochs"] and not pretrained:
        raise ValueError(
            "`head_epochs` trains the head of a pretrained base; with weights=None there is "
            f"none (pass head_epochs=0). Received: head_epochs={head_epochs!r}"
        )
    options["batch_size"] = _validation.positive_int(given["batch_size"], "batch_size")
    rate = given["learning_rate"]
    rate = (0.01 if pretrained else 0.1) if rate is None else rate
    options["learning_rate"] = _validation.positive_float(rate, "learning_rate")
    options["label_smoothing"] = _validation.fraction_below_one(
        given["label_smoothing"], "label_smoothing"
    )
    options["class_weights"] = _validation.choice(
        given["class_weights"], CLASS_WEIGHTS, "class_weights"
    )
    for name in ("flip", "int8", "include_preprocessing", "cache_images"):
        options[name] = _validation.boolean(given[name], name)
    options["seed"] = _validation.seed(given["seed"])
    if given["int8"] and given["include_preprocessing"]:
        raise ValueError(
            "The int8 file quantizes the classifier alone; with its preprocessing inside, the "
            "resize itself would be quantized. Pass one of them (int8 with normalised inputs, "
            "or float files that take raw pixels). Received: int8=True, "
            "include_preprocessing=True"
        )
    _validation.choice(given["verbose"], (0, 1, 2), "verbose")
    return options


def check_formats(
    export_formats: Sequence[str] | None, int8: bool, include_preprocessing: bool = False
) -> tuple[str, ...]:
    """The export formats: the given ones (each refused by name here where it cannot be
    written), or LiteRT and the installed ones of ONNX and OpenVINO."""
    if export_formats is None:
        unsupported = export_lib.unsupported_formats(EXPORT_FORMATS)
        formats = tuple(f for f in EXPORT_FORMATS if f not in unsupported)
    else:
        if isinstance(export_formats, str) or not all(isinstance(f, str) for f in export_formats):
            raise ValueError(
                '`export_formats` must be a sequence of "litert", "onnx", "openvino". '
                f"Received: export_formats={export_formats!r}"
            )
        formats = tuple(dict.fromkeys(export_formats))
        for fmt in formats:
            _validation.choice(fmt, ("litert", "onnx", "openvino"), "export_formats")
        unsupported = export_lib.unsupported_formats(formats)
        if unsupported:
            fmt, why = next(iter(unsupported.items()))
            raise ValueError(f"Cannot export {fmt}: {why}. Received: export_formats={formats}")
    if int8 and not formats:
        raise ValueError(
            "`int8` makes a full-integer file of each exported LiteRT, ONNX and OpenVINO file "
            f"and checks it against the float one: export one. Received: int8=True, "
            f"export_formats={formats}"
        )
    if int8 and export_formats is not None:  # by default, only the installed quantizers
        unsupported = export_lib.unsupported_int8(formats)
        if unsupported:
            fmt, why = next(iter(unsupported.items()))
            raise ValueError(
                f"Cannot write the int8 {fmt} file: {why}. Received: int8=True, "
                f"export_formats={formats}"
            )
    if include_preprocessing and not formats:
        raise ValueError(
            "`include_preprocessing` puts the preprocessing inside the exported files, and "
            "none is exported (model.keras takes normalised images). Export LiteRT, ONNX or "
            f"OpenVINO. Received: include_preprocessing=True, export_formats={formats}"
        )
    return formats


def left_out(export_formats: Sequence[str] | None) -> dict[str, str]:
    """{file name: why it is not written and what installs it} of the default exports this
    install cannot write (none where `export_formats` names the formats: those are
    written or refused)."""
    if export_formats is not None:
        return {}
    reasons = export_lib.unsupported_formats(EXPORT_FORMATS)
    return {export_lib.FILENAMES[fmt]: why for fmt, why in reasons.items()}


def check_output(output_dir: str | os.PathLike, images: str | os.PathLike) -> str:
    """`output_dir` as a path, refused where it names no folder of its own: None, empty,
    a file, or the image folder, inside it or holding it (the next scan would take the run
    for a class; the run's clean-up could remove images). `images` must be a path too."""
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir).strip():
        raise ValueError(
            "`output_dir` must be the path of the run's folder. "
            f"Received: output_dir={output_dir!r}"
        )
    if not isinstance(images, (str, os.PathLike)):
        raise ValueError(
            f"`images` must be the path of the image folder. Received: images={images!r}"
        )
    output_dir = os.fspath(output_dir)
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise RunDirectoryError(f"The output folder is a file. Received: output_dir={output_dir!r}")
    inside = os.path.realpath(output_dir), os.path.realpath(images)
    if os.path.commonpath(inside) in inside:
        raise RunDirectoryError(
            "The output folder and the image folder must be apart (neither inside the "
            "other): the next scan would take the run for a class of images. Received: "
            f"output_dir={output_dir!r}, images={os.fspath(images)!r}"
        )
    return output_dir


def check_weights_outside(weights: object, output_dir: str) -> None:
    """Refuses `weights` (a `.keras` file or preset folder) that is one of the files the
    run in `output_dir` writes (`RUN_FILES`: its `preset/`, `model.keras`, ...): a run
    replacing a finished one removes them before it reads its weights."""
    if not isinstance(weights, (str, os.PathLike)) or not os.path.exists(weights):
        return  # "imagenet", None, a registry preset's name
    inside = os.path.relpath(os.path.realpath(weights), os.path.realpath(output_dir))
    if inside.split(os.sep)[0] in RUN_FILES:
        raise RunDirectoryError(
            f"`weights` is one of the files the run in {output_dir} writes ({inside}): "
            "the run would remove it before reading it. Copy it out of the run's folder "
            f"first, or use another output folder. Received: weights={os.fspath(weights)!r}"
        )
