"""What an exported file needs to classify images besides its runtime: its class names and
its preprocessing, from the file's own metadata (`export.runner`) or from the side files an
older fine-tune run wrote beside it (`labels.txt`, `preprocessing.json`), each read as
untrusted: up to a bound, checked key by key."""

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import keras
import numpy as np

from keras_autoshuffle import _validation, applications
from keras_autoshuffle.applications.preprocessing import ResizeCenterCrop, evaluation_sizes
from keras_autoshuffle.export.metadata import IMAGENET_PIXEL_MEAN, IMAGENET_PIXEL_STD
from keras_autoshuffle.export.runner import Runner

LABELS_FILE = "labels.txt"
PREPROCESSING_FILE = "preprocessing.json"
# Bounds on the side files (a user's file may be anything): a million short class names.
MAX_LABELS_BYTES = 16 * 2**20
MAX_PREPROCESSING_BYTES = 64 * 2**10
PREPROCESSING_KEYS = ("image_size", "resize_size", "mean", "std", "exports_include_preprocessing")


def read_labels(path: str | os.PathLike) -> list[str]:
    """The class names in a `labels.txt` file: UTF-8, one per line, in output order.

    Args:
        path: the file.

    Returns:
        The names, a non-empty list of distinct, non-blank strings.

    Raises:
        FileNotFoundError: there is no file at `path`.
        ValueError: the file is not a regular file, larger than `MAX_LABELS_BYTES`, not
            UTF-8, empty, or holds a blank or repeated name (naming the lines).
    """
    what = "the class names, one per line in the model's output order (UTF-8)"
    text = _read_text(path, MAX_LABELS_BYTES, what)
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines:
        raise ValueError(f"{path} is empty; it must hold {what}. Received: path={str(path)!r}")
    _check_labels(lines, str(path))
    first = {}
    for line, label in enumerate(lines, 1):
        if label in first:  # two outputs of one name: a mistake in a file of one's own
            raise ValueError(
                f"{path}: the class name {label!r} is on lines {first[label]} and {line}; "
                f"each output needs a name of its own. Received: {label!r} twice"
            )
        first[label] = line
    return lines


def read_preprocessing(path: str | os.PathLike) -> dict:
    """The preprocessing settings in a `preprocessing.json` file.

    The file holds one JSON object with exactly these keys: `image_size` (the model's
    input side) and `resize_size` (the shorter side before the central crop, or null for
    the default), integers in the ranges `applications.evaluation_preprocessing` takes
    (checked there); `mean` and `std`, ImageNet's (the normalisation
    `evaluation_preprocessing` computes); `exports_include_preprocessing`, true or false.

    Args:
        path: the file.

    Returns:
        The settings, a dict with the keys above.

    Raises:
        FileNotFoundError: there is no file at `path`.
        ValueError: the file is not a regular file of at most `MAX_PREPROCESSING_BYTES`,
            not JSON, or a key is missing, unknown or of a wrong value (naming it).
    """
    what = (
        'a JSON object such as {"image_size": 224, "resize_size": 256, "mean": [0.485, '
        '0.456, 0.406], "std": [0.229, 0.224, 0.225], "exports_include_preprocessing": false}'
    )
    text = _read_text(path, MAX_PREPROCESSING_BYTES, what)
    try:
        settings = json.loads(text)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        raise ValueError(
            f"{path} is not JSON ({_validation.one_line(error)}); it must hold {what}. "
            f"Received: path={str(path)!r}"
        ) from None

    def refuse(problem, received):
        return ValueError(f"{path}: {problem}; the file must hold {what}. Received: {received}")

    if not isinstance(settings, dict):
        raise refuse("not a JSON object", f"a JSON {type(settings).__name__}")
    missing = [key for key in PREPROCESSING_KEYS if key not in settings]
    unknown = sorted(set(settings) - set(PREPROCESSING_KEYS))
    if missing or unknown:
        raise refuse("keys missing or unknown", f"missing keys {missing}, unknown keys {unknown}")
    for key in ("image_size", "resize_size"):
        value = settings[key]
        if not (_validation.is_integer(value) or (key == "resize_size" and value is None)):
            kind = "an integer" if key == "image_size" else "an integer or null"
            raise refuse(f"{key} must be {kind}", f"{key}={value!r}")
    for key, reference in (
        ("mean", applications.IMAGENET_MEAN),
        ("std", applications.IMAGENET_STD),
    ):
        value = settings[key]
        numbers = isinstance(value, list) and len(value) == 3
        numbers = numbers and all(map(_validation.is_finite_number, value))
        if not numbers or not np.allclose(value, reference, rtol=0, atol=1e-6):
            raise refuse(
                f"{key} must be ImageNet's {list(reference)} (the normalisation "
                "evaluation_preprocessing computes)",
                f"{key}={value!r}",
            )
    include = settings["exports_include_preprocessing"]
    if not isinstance(include, bool):
        raise refuse(
            "exports_include_preprocessing must be true or false",
            f"exports_include_preprocessing={include!r}",
        )
    return settings


def _check_labels(labels, source):
    """`labels` as a tuple of non-blank strings; ValueError naming `source` (ImageNet's
    names repeat a few: "crane" is a bird and a machine)."""
    if isinstance(labels, str) or not isinstance(labels, Sequence) or not labels:
        raise ValueError(
            f"`labels` must be a non-empty list of class names. Received: labels={labels!r}"
        )
    for line, label in enumerate(labels, 1):
        if not isinstance(label, str) or not label.strip():
            raise ValueError(
                f"{source}: class name {line} is blank or not a string; every class needs a "
                f"name. Received: {label!r} on line {line}"
            )
    return tuple(labels)


def _read_text(path, limit, what):
    """The UTF-8 text of the regular file `path`, at most `limit` bytes; errors say the
    file must hold `what`."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} is missing: it must hold {what}. Received: path={path!r}")
    if not os.path.isfile(path):  # a folder, or a FIFO that would block the read
        raise ValueError(f"{path} is not a regular file; it must hold {what}. Received: {path=}")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(
            f"{path} is larger than {limit} bytes; it must hold {what}. Received: {path=}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text ({error.reason} at byte {error.start}); it must hold "
            f"{what}. Received: {path=}"
        ) from None


def class_names(runner: Runner, labels_path: str) -> list[str]:
    """The class names of the file `runner` runs: `labels_path` (a `labels.txt`) where
    present, equal to the file's metadata's where it has some (else ValueError naming the
    field), else the metadata's; FileNotFoundError where neither is."""
    if not os.path.lexists(labels_path):
        if runner.labels is None:
            raise FileNotFoundError(
                f"{labels_path} is missing and {runner.path} holds no class names in its "
                "metadata: one of them must hold the class names, one per line in the "
                f"model's output order. Received: path={runner.path!r}"
            )
        return list(_check_labels(runner.labels, f"{runner.path} (metadata field `labels`)"))
    labels = read_labels(labels_path)
    theirs = runner.labels
    if theirs is not None and len(labels) != len(theirs):
        raise ValueError(
            f"{labels_path} names {len(labels)} classes but the metadata field `labels` of "
            f"{runner.path} names {len(theirs)}: they are of different exports. Remove "
            f"{LABELS_FILE}, or export again. Received: {len(labels)} and {len(theirs)} labels"
        )
    if theirs is not None and tuple(labels) != theirs:
        i = next(i for i, (a, b) in enumerate(zip(labels, theirs, strict=True)) if a != b)
        raise ValueError(
            f"{labels_path} and the metadata field `labels` of {runner.path} disagree on "
            f"class {i}: they are of different exports. Remove {LABELS_FILE}, or export "
            f"again. Received: {labels[i]!r} and {theirs[i]!r}"
        )
    return labels


def preprocessing(runner: Runner, settings_path: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The function from a uint8 image batch to the file's input: the resize and centre
    crop of `preprocessing.json` (else of the file's input shape), then the normalisation
    the file's metadata declares (else ImageNet's); None for a file that takes raw pixels
    (`exports_include_preprocessing`)."""
    if os.path.lexists(settings_path):
        settings = read_preprocessing(settings_path)
        raw = settings["exports_include_preprocessing"] and runner.format != "keras"
        image_size, resize_size = settings["image_size"], settings["resize_size"]
        source = settings_path
    else:
        if runner.input.mean is None:
            raise FileNotFoundError(
                f"{settings_path} is missing and {runner.path} describes no input "
                "normalisation in its metadata: one of them must say how to preprocess "
                f"images. Received: path={runner.path!r}"
            )
        shape = runner.input.shape
        raw, image_size, resize_size, source = False, shape[0] if shape else None, None, None
        if shape[:2] != (image_size, image_size) or image_size is None:
            raise ValueError(
                f"{runner.path} takes inputs of shape {runner.input.shape}: without "
                f"{PREPROCESSING_FILE} beside it, the image size comes from a square input "
                f"shape. Received: input shape {runner.input.shape}"
            )
    _check_input_shape(runner.input.shape, raw, image_size, runner.path, source)
    if raw:
        return None
    try:  # its checks of the sizes, named after the file
        image_size, resize_size = evaluation_sizes(image_size, resize_size)
    except ValueError as error:
        raise ValueError(f"{source or runner.path}: {_validation.one_line(error)}") from None
    crop = ResizeCenterCrop(resize_size, image_size)
    described = runner.input
    if described.mean is None:  # an older run's file: preprocessing.json's normalisation
        described = dataclasses.replace(described, mean=IMAGENET_PIXEL_MEAN, std=IMAGENET_PIXEL_STD)
    return lambda images: described.normalize(keras.ops.convert_to_numpy(crop(images)))


def _check_input_shape(shape, raw, image_size, model_path, preprocessing_path):
    """Refuses a model whose input (without the batch axis; None: any) is not RGB images
    of the size `preprocessing.json` gives: `image_size` squares, or any size when the
    exports take raw pixels (`raw`)."""
    if len(shape) != 3 or shape[-1] not in (3, None):
        raise ValueError(
            f"{model_path} takes inputs of shape {shape}, not RGB images (height, width, 3). "
            f"Received: input shape {shape}"
        )
    sides = tuple(shape[:2])
    if raw and sides != (None, None):
        raise ValueError(
            f"{preprocessing_path} says the exports take raw pixels of any size "
            f"(exports_include_preprocessing: true), but {model_path} takes {sides} images: "
            f"the two files are of different exports. Received: input shape {shape}"
        )
    if not raw and any(side not in (None, image_size) for side in sides):
        raise ValueError(
            f"{model_path} takes {sides[0]}x{sides[1]} images but {preprocessing_path} gives "
            f"image_size {image_size}: the two files are of different exports. "
            f"Received: input shape {shape}"
        )
