"""Measures of a fine-tuned classifier: validation metrics, the confusion matrix as a PNG,
and each exported file's latency on this machine (`report.py` writes them up)."""

import os
import platform
import time
import warnings
from collections.abc import Sequence

import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle._cpu import cpu_info
from keras_autoshuffle.export.runner import open_runner

# Above this many classes the cells of the confusion matrix hold no count (too small to
# read); the colours still show the matrix.
MAX_ANNOTATED_CLASSES = 30
# Class names longer than this are shortened on the figure's axes (report.md has them whole).
MAX_LABEL_CHARS = 40
# Fonts tried in order for each glyph of a class name (those installed are used): DejaVu
# Sans (matplotlib's own) covers Latin, Greek and Cyrillic; the others CJK and more.
_FONTS = (
    "DejaVu Sans",
    "Noto Sans",
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "Arial Unicode MS",
)


def _short(array: np.ndarray) -> str:
    """`array` as text short enough for an error message."""
    return np.array2string(np.asarray(array), threshold=12, edgeitems=3)


def _array(value, name: str) -> np.ndarray:
    """`value` as a NumPy array; ValueError naming `name` where it is none (ragged lists)."""
    try:
        return np.asarray(value)
    except ValueError as error:
        raise ValueError(
            f"`{name}` must be an array. Received: {name}={value!r} ({error})"
        ) from error


def _class_names(class_names: Sequence[str]) -> list[str]:
    """`class_names` as a list: one or more distinct strings; ValueError otherwise."""
    if isinstance(class_names, (str, bytes)) or not isinstance(class_names, Sequence):
        raise ValueError(
            "`class_names` must be a sequence of strings (a list). "
            f"Received: class_names={class_names!r}"
        )
    names = list(class_names)
    if not names or not all(isinstance(name, str) for name in names):
        raise ValueError(
            f"`class_names` must be one or more strings. Received: class_names={names!r}"
        )
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(
            f"`class_names` must not repeat a name. Received: class_names={names!r} "
            f"(repeated: {repeated!r})"
        )
    return names


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray, class_names: Sequence[str]
) -> dict:
    """Accuracy overall and per class, and the confusion matrix, of predicted classes (the
    argmax of each row of `probabilities`, the first of tied maxima).

    Args:
        labels: the true classes, integers in [0, len(class_names)), shape (N,), N >= 1.
        probabilities: the model's outputs, finite numbers, shape (N, len(class_names)).
        class_names: the classes' names, in the order of the model's outputs.

    Returns:
        `{"examples": N, "accuracy", "per_class": [{"name", "examples", "accuracy"
            (recall; None without examples), "precision" (None if never predicted)}],
            "confusion_matrix": [[int]] (rows true, columns predicted)}`, JSON-ready.

    Raises:
        ValueError: a bad argument, naming it and its value.
    """
    names = _class_names(class_names)
    labels = _array(labels, "labels")
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            "`labels` must be a 1-D array of one or more integer class indices. Received: "
            f"labels={_short(labels)} (shape {labels.shape}, dtype {labels.dtype})"
        )
    outside = (labels < 0) | (labels >= len(names))
    if outside.any():
        raise ValueError(
            f"`labels` must be class indices in [0, {len(names) - 1}] ({len(names)} "
            f"class_names). Received: labels={_short(labels)} "
            f"(out of range: {_short(np.unique(labels[outside]))})"
        )
    probabilities = _array(probabilities, "probabilities")
    dtype = probabilities.dtype
    real = np.issubdtype(dtype, np.number) and not np.issubdtype(dtype, np.complexfloating)
    if not real or probabilities.shape != (labels.size, len(names)):
        raise ValueError(
            "`probabilities` must be an array of real numbers of shape "
            f"({labels.size}, {len(names)}) (len(labels), len(class_names)). "
            "Received: probabilities of shape "
            f"{probabilities.shape}, dtype {probabilities.dtype}"
        )
    if not np.all(np.isfinite(probabilities)):
        bad = int(np.size(probabilities) - np.isfinite(probabilities).sum())
        raise ValueError(
            "`probabilities` must be finite. Received: probabilities with "
            f"{bad} non-finite values of {probabilities.size}"
        )
    count = len(names)
    labels = labels.astype(np.int64)  # uint8 labels * count would wrap around
    predicted = np.argmax(probabilities, axis=1)
    # Each (true, predicted) pair as one index of the flattened matrix, counted at once.
    matrix = np.bincount(labels * count + predicted, minlength=count * count).reshape(count, -1)
    correct = np.diag(matrix)
    examples, predictions = matrix.sum(axis=1), matrix.sum(axis=0)
    per_class = [
        {
            "name": name,
            "examples": int(examples[i]),
            "accuracy": float(correct[i] / examples[i]) if examples[i] else None,
            "precision": float(correct[i] / predictions[i]) if predictions[i] else None,
        }
        for i, name in enumerate(names)
    ]
    return {
        "examples": int(labels.size),
        "accuracy": float(correct.sum() / labels.size),
        "per_class": per_class,
        "confusion_matrix": matrix.astype(int).tolist(),
    }


def _confusion_matrix(matrix, count: int) -> np.ndarray:
    """`matrix` as a (count, count) int64 array of counts >= 0; ValueError otherwise."""
    array = _array(matrix, "matrix")
    ok = (
        array.shape == (count, count)
        and np.issubdtype(array.dtype, np.number)
        and not np.issubdtype(array.dtype, np.complexfloating)
        and np.all(np.isfinite(array))
    )
    if not ok or np.any(array < 0) or np.any(array != np.round(array)):
        raise ValueError(
            f"`matrix` must be a ({count}, {count}) array of counts (integers >= 0), one row "
            f"and column per class name. Received: matrix={_short(array)} "
            f"(shape {array.shape}, dtype {array.dtype})"
        )
    return array.astype(np.int64)


def _label(name: str) -> str:
    """A class name as the figure shows it: on one line, at most `MAX_LABEL_CHARS`."""
    name = " ".join(name.split())
    return name if len(name) <= MAX_LABEL_CHARS else name[: MAX_LABEL_CHARS - 1] + "…"


def plot_confusion_matrix(
    matrix: np.ndarray | Sequence[Sequence[int]],
    class_names: Sequence[str],
    path: str | os.PathLike,
) -> str:
    """Draws a confusion matrix and writes it as a PNG, atomically, without touching
    pyplot's backend. Colours are the fraction of each row (each true class's examples);
    the cells hold the counts up to `MAX_ANNOTATED_CLASSES` classes.

    Args:
        matrix: counts, rows the true class and columns the predicted one, as
            `classification_metrics`'s `"confusion_matrix"`.
        class_names: the classes' names (any Unicode; cut at `MAX_LABEL_CHARS`).
        path: the PNG file to write (its folder is created if missing).

    Returns:
        `path`, as a string.

    Raises:
        ValueError: `class_names` not distinct strings, or `matrix` not a square array of
            counts with a row per class name.
    """
    from matplotlib import font_manager
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = _class_names(class_names)
    counts = _confusion_matrix(matrix, len(names))
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a file path. Received: path={path!r}")
    path = os.fspath(path)
    count = len(names)
    totals = counts.sum(axis=1, keepdims=True)
    fractions = counts / np.maximum(totals, 1)  # a class without examples: an empty row

    installed = {font.name for font in font_manager.fontManager.ttflist}
    fonts = [font for font in _FONTS if font in installed] or ["sans-serif"]
    side = max(4.0, 2.0 + 0.26 * count)  # inches: about 0.26 in (19 pt) a class
    label_size = 10.0 if count <= MAX_ANNOTATED_CLASSES else 8.0
    figure = Figure(figsize=(side + 1.5, side), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(fractions, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    colorbar = figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    colorbar.set_label("fraction of the true class")
    ticks = np.arange(count)
    labels = [_label(name) for name in names]
    # parse_math=False: a "$" in a name is text, not the start of a formula.
    text = {"fontsize": label_size, "fontfamily": fonts, "parse_math": False}
    axes.set_xticks(ticks, labels, rotation=90, **text)
    axes.set_yticks(ticks, labels, **text)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title("Confusion matrix (validation)")
    if count <= MAX_ANNOTATED_CLASSES:
        cell_size = float(np.clip(120 / count, 6, 12))
        for row, column in np.ndindex(count, count):
            axes.text(
                column,
                row,
                str(counts[row, column]),
                ha="center",
                va="center",
                fontsize=cell_size,
                color="white" if fractions[row, column] > 0.5 else "black",
            )

    def write(partial: str) -> None:
        with warnings.catch_warnings():
            # A glyph no installed font has is drawn as a box; the names are whole in
            # report.md, so one warning per missing glyph would only be noise.
            warnings.filterwarnings("ignore", message="Glyph .* missing from")
            figure.savefig(partial, format="png", bbox_inches="tight")

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return write_atomically(path, write)


# The x86 features that decide which kernels the runtimes pick, float and int8 (machines
# of one model name differ in them: an AMD EPYC with or without AVX-512), as named.
_CPU_FEATURES = (
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "BF16"),
    ("amx_int8", "AMX"),
)


def cpu_name() -> str:
    """This machine's CPU model name (Linux's /proc/cpuinfo), else the platform's processor
    string, else the machine type (e.g. "x86_64"); on x86 Linux followed by the features
    that change float and int8 speed (`describe_cpu`).

    Returns:
        The name, never empty.
    """
    name, flags = cpu_info()
    return describe_cpu(name or platform.processor() or platform.machine() or "unknown", flags)


def describe_cpu(name: str, flags: Sequence[str] | None) -> str:
    """A CPU's model name with the x86 features that change float and int8 speed among
    `flags` (lscpu's or /proc/cpuinfo's): "AMD EPYC (AVX-512 VNNI BF16)", "AMD EPYC (no
    AVX-512)"; `name` alone where the flags are unknown (None)."""
    if flags is None:
        return name
    features = [label for flag, label in _CPU_FEATURES if flag in flags]
    if "avx512f" not in flags:
        features.insert(0, "no AVX-512")
    return f"{name} ({' '.join(features)})"


def file_latency(
    path: str | os.PathLike,
    input_shape: tuple[int, ...],
    num_threads: int = 1,
    warmup: int = 5,
    runs: int = 30,
    pixels: bool = False,
) -> dict:
    """Milliseconds per image of an exported file on this machine, batch 1, with its runtime
    (`export.runner.open_runner`): `warmup` untimed calls, then `runs` calls each timed
    alone, on one random input (seed 0; uint8 pixels with `pixels`).

    Args:
        path: a `.tflite`, a `.onnx`, an OpenVINO IR folder or `.xml`, or a `.keras` file.
        input_shape: the file's input shape, batch first and batch 1, e.g. (1, 224, 224,
            3).
        num_threads: the runtime's threads (intra-op threads), >= 1.
        warmup: untimed calls before the timed ones, >= 0.
        runs: timed calls, >= 1.
        pixels: the input is raw pixels (uint8) rather than a normalised image.

    Returns:
        `{"median_ms", "p90_ms"` (of the `runs` calls), `"runs", "num_threads"}`.

    Raises:
        ValueError: a bad argument (naming it), or no exported file at `path`.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.path.exists(path):
        raise ValueError(f"`path` must be an existing exported file. Received: path={path!r}")
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
    if not shape or not all(_validation.is_integer(v) and v >= 1 for v in shape) or shape[0] != 1:
        raise ValueError(
            "`input_shape` must be a tuple of positive integers, batch first and batch 1, "
            f"e.g. (1, 224, 224, 3). Received: input_shape={input_shape!r}"
        )
    shape = tuple(int(v) for v in shape)
    num_threads = _validation.positive_int(num_threads, "num_threads")
    warmup = _validation.non_negative_int(warmup, "warmup")
    runs = _validation.positive_int(runs, "runs")
    _validation.choice(pixels, (False, True), "pixels")
    rng = np.random.default_rng(0)
    if pixels:
        x = rng.integers(0, 256, size=shape, dtype=np.uint8)
    else:
        x = rng.normal(size=shape).astype("float32")
    runner = open_runner(path, num_threads)
    for _ in range(warmup):
        runner.run(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.run(x)
        times.append(1000 * (time.perf_counter() - start))
    return {
        "median_ms": float(np.median(times)),
        "p90_ms": float(np.percentile(times, 90)),
        "runs": runs,
        "num_threads": num_threads,
    }
