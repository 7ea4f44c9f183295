"""The fine-tuning report: validation metrics, the confusion matrix as a PNG, each exported
file's latency on this machine, and `report.json` + `report.md` in the output folder.

Every file is written atomically (`_atomic`): a killed run leaves the previous report or
the new one, never half of one.
"""

import datetime
import json
import os
import platform
import re
import time
import warnings
from collections.abc import Sequence

import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import write_atomically, write_json
from keras_autoshuffle.export.int8 import INT8_RUNTIMES

# The formats `file_latency` runs: "int8" is the full-integer `.tflite`, run by LiteRT;
# "onnx_int8" and "openvino_int8" the full-integer ONNX file and OpenVINO folder.
LATENCY_FORMATS = ("litert", "int8", "onnx", "openvino", "onnx_int8", "openvino_int8")
REPORT_JSON, REPORT_MD, CONFUSION_PNG = "report.json", "report.md", "confusion_matrix.png"
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
    """Accuracy overall and per class, and the confusion matrix, of predicted classes.

    The predicted class of an example is the argmax of its row of `probabilities` (the
    first of tied maxima); logits or any scores give the same.

    Args:
        labels: the true classes, integers in [0, len(class_names)), shape (N,), N >= 1.
        probabilities: the model's outputs, finite numbers, shape (N, len(class_names)).
        class_names: the classes' names, in the order of the model's outputs.

    Returns:
        `{"examples": N, "accuracy": fraction correct, "per_class": [{"name",
            "examples" (of that true class), "accuracy" (recall: correct / examples; None
            where the class has no example), "precision" (correct / predicted as that
            class; None where never predicted)}, ...] in the order of `class_names`,
            "confusion_matrix": [[int]] (rows: true class, columns: predicted class)}`.
            Plain Python numbers, ready for JSON.

    Raises:
        ValueError: a bad argument, naming it and its value: `class_names` not distinct
            strings, `labels` not 1-D integers or out of range, `probabilities` not a
            finite (N, len(class_names)) array.
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
    """Draws a confusion matrix and writes it as a PNG, atomically.

    Colours are the fraction of each row (of each true class's examples), so a rare class's
    errors show as clearly as a common one's; the cells hold the counts up to
    `MAX_ANNOTATED_CLASSES` classes. The figure grows with the number of classes (readable
    up to about 100). Drawn on a `matplotlib.figure.Figure` with the Agg canvas: no display
    is needed, and pyplot's backend (the user's choice) is not touched.

    Args:
        matrix: counts, rows the true class and columns the predicted one, as
            `classification_metrics`'s `"confusion_matrix"`.
        class_names: the classes' names (any Unicode; shown whole up to `MAX_LABEL_CHARS`
            characters; glyphs no installed font has show as boxes).
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


def _runner(path: str, fmt: str, num_threads: int, shape: tuple[int, ...]):
    """A function running the file `path` of format `fmt` on one input, with its runtime."""
    if fmt in ("litert", "int8"):
        from keras_autoshuffle.export.litert import litert_interpreter, litert_run

        interpreter = litert_interpreter(path, 1, num_threads, shape=shape)
        return lambda x: litert_run(interpreter, x)
    from keras_autoshuffle.export import onnx_runtimes

    if fmt in ("onnx", "onnx_int8"):
        session = onnx_runtimes.onnx_session(path, num_threads)
        return lambda x: onnx_runtimes.onnx_run(session, x)
    # Float32 whatever the CPU (its plugin's default is bfloat16 on some).
    compiled = onnx_runtimes.openvino_model(path, num_threads, precision="f32")
    return lambda x: onnx_runtimes.openvino_run(compiled, x)


def file_latency(
    path: str | os.PathLike,
    fmt: str,
    input_shape: tuple[int, ...],
    num_threads: int = 1,
    warmup: int = 5,
    runs: int = 30,
    pixels: bool = False,
) -> dict:
    """Milliseconds per image of an exported file on this machine, batch 1, with its runtime.

    The file is loaded with the package's runner of its format (LiteRT for "litert" and
    "int8", ONNX Runtime, OpenVINO's CPU plugin in float32), called `warmup` times untimed
    (allocation, and the thread pools of an earlier runtime settle), then `runs` times,
    each call timed alone (wall clock), on one random input (seed 0): standard normal
    float32 values, or with `pixels` uint8 values in [0, 255] (a file taking raw pixels).

    Args:
        path: the file: a `.tflite` ("litert", "int8"), a `.onnx` ("onnx", "onnx_int8"),
            an OpenVINO IR folder or its `.xml` ("openvino", "openvino_int8").
        fmt: one of LATENCY_FORMATS.
        input_shape: the file's input shape, batch first and batch 1, e.g. (1, 224, 224,
            3).
        num_threads: the runtime's threads (intra-op threads), >= 1.
        warmup: untimed calls before the timed ones, >= 0.
        runs: timed calls, >= 1.
        pixels: the input is raw pixels (uint8) rather than a normalised image.

    Returns:
        `{"median_ms", "p90_ms"` (of the `runs` calls), `"runs", "num_threads"}`.

    Raises:
        ValueError: a bad argument (naming it), or no file at `path`.
    """
    fmt = _validation.choice(fmt, LATENCY_FORMATS, "fmt")
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
    call = _runner(os.fspath(path), fmt, num_threads, shape)
    for _ in range(warmup):
        call(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call(x)
        times.append(1000 * (time.perf_counter() - start))
    return {
        "median_ms": float(np.median(times)),
        "p90_ms": float(np.percentile(times, 90)),
        "runs": runs,
        "num_threads": num_threads,
    }


def cpu_name() -> str:
    """This machine's CPU model name (Linux's /proc/cpuinfo), else the platform's processor
    string, else the machine type (e.g. "x86_64").

    Returns:
        The name, never empty.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _md(value) -> str:
    """`value` as Markdown text on one line, its characters with a meaning there escaped:
    `|` would end a table cell, `*` or `_` start emphasis, `<` HTML, `[` a link, `$` a
    formula on GitHub. `-`, `#` and the like only matter at the start of a line, where no
    such text goes, and `_` inside a word (golden_retriever) starts nothing: both stay, so
    the raw file reads as well as the rendered one."""
    text = re.sub(
        r"[\\`*<>|~$\[\]]", lambda match: "\\" + match.group(), " ".join(str(value).split())
    )
    return re.sub(r"(?<![^\W_])_|_(?![^\W_])", r"\\_", text)


def _code(value) -> str:
    """`value` as a Markdown code span on one line (file names, settings: nothing in it is
    formatting; `|` still escaped, or it would end a table cell)."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _value(value) -> str:
    """A setting's value as text: strings as they are, containers as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value.item() if hasattr(value, "item") else value)


def _percent(fraction) -> str:
    return "–" if fraction is None else f"{100 * float(fraction):.2f} %"


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _section(report: dict, key: str) -> dict | None:
    """`report[key]`, a dict, or None where absent; ValueError for another type."""
    value = report.get(key)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"`report[{key!r}]` must be a dict. Received: report[{key!r}]={value!r}")
    return value


def _data_lines(data: dict) -> list[str]:
    lines = ["## Data", ""]
    classes = data.get("classes")
    if classes is not None:
        lines.append(f"- Classes ({len(classes)}): " + ", ".join(_md(c) for c in classes))
    for key, title in (
        ("train_examples", "Training images"),
        ("val_examples", "Validation images"),
    ):
        if data.get(key) is not None:
            lines.append(f"- {title}: {_md(data[key])}")
    source = data.get("source")
    if source is not None:
        text = source if isinstance(source, str) else _value(source)
        lines.append(f"- Validation images from: {_md(text)}")
    skipped = data.get("skipped")
    if skipped is not None:
        if isinstance(skipped, (list, tuple)):
            shown = ", ".join(_code(s) for s in skipped[:10])
            more = f", and {len(skipped) - 10} more" if len(skipped) > 10 else ""
            text = f"{len(skipped)}" + (f" ({shown}{more})" if skipped else "")
        else:
            text = _md(_value(skipped))
        lines.append(f"- Skipped files: {text}")
    return lines + [""]


def _settings_lines(settings: dict) -> list[str]:
    rows = [[_code(key), _code(_value(value))] for key, value in settings.items()]
    return ["## Settings", "", *_table(["setting", "value"], ["---", "---"], rows), ""]


def _validation_lines(validation: dict, image: str | None) -> list[str]:
    lines = ["## Validation", ""]
    if validation.get("accuracy") is not None:
        examples = validation.get("examples")
        of = f" of {examples} images" if examples is not None else ""
        lines += [f"Accuracy: **{_percent(validation['accuracy'])}**{of}.", ""]
    per_class = validation.get("per_class") or []
    if per_class:
        rows = [
            [
                _md(entry.get("name", "")),
                str(entry.get("examples", "")),
                _percent(entry.get("accuracy")),
                _percent(entry.get("precision")),
            ]
            for entry in per_class
        ]
        header = ["class", "val images", "accuracy", "precision"]
        lines += [*_table(header, ["---", "---:", "---:", "---:"], rows), ""]
        lines += [
            "Accuracy: correct / validation images of the class (– where it has none); "
            "precision: correct / images predicted as the class (– where none is).",
            "",
        ]
    if image:
        lines += [f"![confusion matrix]({image})", ""]
        lines += ["Rows: true class; columns: predicted class; colours: fraction of the row.", ""]
    return lines


# The exported files' table: (column header, alignment, the cell of a file's entry or None
# where the entry lacks it). A column no file has is left out.
def _latency_cell(entry: dict) -> str | None:
    latency = entry.get("latency")
    if not isinstance(latency, dict) or latency.get("median_ms") is None:
        return None
    p90 = latency.get("p90_ms")
    return f"{float(latency['median_ms']):.2f}" + (
        "" if p90 is None else f" (p90 {float(p90):.2f})"
    )


def _threads_cell(entry: dict) -> str | None:
    latency = entry.get("latency")
    threads = latency.get("num_threads") if isinstance(latency, dict) else None
    return None if threads is None else str(threads)


def _file_columns(output_dir: str):
    def file_cell(entry):
        path = entry.get("path")
        if path is None:
            return None
        relative = os.path.relpath(os.path.abspath(path), os.path.abspath(output_dir))
        return _code(path if relative.startswith("..") else relative)

    def size_cell(entry):
        size = entry.get("size_bytes")
        return None if size is None else f"{float(size) / 1e6:.3g}"

    def fraction_cell(key):
        return lambda entry: None if entry.get(key) is None else _percent(entry[key])

    return [
        ("file", "---", file_cell),
        ("size (MB)", "---:", size_cell),
        ("accuracy", "---:", fraction_cell("accuracy")),
        ("top-1 agreement with Keras", "---:", fraction_cell("top1_agreement")),
        ("latency ms/image (median)", "---:", _latency_cell),
        ("threads", "---:", _threads_cell),
    ]


def _files_lines(files: dict, output_dir: str, cpu: str) -> list[str]:
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise ValueError(
                f"`report['files'][{name!r}]` must be a dict. "
                f"Received: report['files'][{name!r}]={entry!r}"
            )
    cells = [
        (header, align, [cell(entry) for entry in files.values()])
        for header, align, cell in _file_columns(output_dir)
    ]
    cells = [column for column in cells if any(value is not None for value in column[2])]
    header = ["format"] + [column[0] for column in cells]
    align = ["---"] + [column[1] for column in cells]
    rows = [[_md(name)] + [column[2][i] or "" for column in cells] for i, name in enumerate(files)]
    lines = ["## Exported files", ""]
    lines += [*_table(header, align, rows), ""]
    if any(entry.get("latency") for entry in files.values()):
        lines += [
            f"Latency: one image (batch 1) at a time, on {_md(cpu)}; p90 in brackets.",
            "",
        ]
    raw = [
        entry["latency_input_shape"] for entry in files.values() if "latency_input_shape" in entry
    ]
    if raw:
        height, width = raw[0][1:3]
        lines += [
            "The exported files take raw RGB pixels (uint8) of any size, their preprocessing "
            f"inside: each latency is of one {height} x {width} image (the first validation "
            "image), the preprocessing included.",
            "",
        ]
    return lines


def int8_check_line(key: str, entry: dict) -> str:
    """One line for the commands' summaries: the int8 file `key`'s ("int8", "onnx_int8",
    "openvino_int8") check `entry`, its accuracy beside the float model's, the drop and its
    bound, the top-1 agreement, and whether the file was written."""
    drop = entry.get("accuracy_drop")
    if drop is None:  # a check from before the drop was recorded
        drop = 100 * (entry["float_accuracy"] - entry["accuracy"])
    bound = entry.get("max_accuracy_drop")
    line = (
        f"int8 {INT8_RUNTIMES[key]}: accuracy {entry['accuracy']:.4f} (float "
        f"{entry['float_accuracy']:.4f}), drop {drop:.2f} points"
        + ("" if bound is None else f" (bound {bound:g})")
        + f", top-1 agreement {entry['top1_agreement']:.4f}"
    )
    if entry.get("test_examples"):
        line += f" on {entry['test_examples']} images"
    if entry.get("refused"):
        return line + ": refused (drop beyond --int8-max-drop), no file written"
    return line + f", {entry['size_ratio']:.2f}x smaller: written"


def _int8_lines(int8: dict, runtime: str) -> list[str]:
    lines = [f"## int8 {runtime}", ""]
    if int8.get("refused"):
        reason = int8["refused"]
        lines.append("- Refused" + ("" if reason is True else f": {_md(reason)}"))
    elif int8.get("path"):
        lines.append(f"- Written: `{os.path.basename(int8['path'])}`")
    if int8.get("accuracy") is not None and int8.get("float_accuracy") is not None:
        examples = int8.get("test_examples")
        lines.append(
            f"- Accuracy: {_percent(int8['accuracy'])}, the float model's "
            f"{_percent(int8['float_accuracy'])}"
            + (f" (on {examples} validation images)" if examples else "")
        )
    if int8.get("accuracy_drop") is not None:
        drop = float(int8["accuracy_drop"])
        bound = int8.get("max_accuracy_drop")
        lines.append(
            f"- Accuracy drop from the float model: {drop:.2f} percentage points"
            + ("" if bound is None else f" (bound: {float(bound):g}, `--int8-max-drop`)")
        )
    if int8.get("top1_agreement") is not None:
        lines.append(f"- Top-1 agreement with the float model: {_percent(int8['top1_agreement'])}")
    return lines + [""]


def write_report(output_dir: str | os.PathLike, report: dict) -> dict[str, str]:
    """Writes the fine-tuning report: `report.json`, `report.md` and, with validation
    metrics, `confusion_matrix.png` (embedded in `report.md`), each atomically.

    `report.md` is a summary for people: every section and entry `report` lacks is left
    out (never shown as "None"); apart from its one "Written" line, the same `report`
    gives the same text. `report.json` holds `report` as given, plus `"cpu"` and
    `"written"` where it lacks them.

    The keys read (all optional):

    - `report["data"]`: `{"classes": [names], "train_examples": int, "val_examples": int,
      "source": where the validation images came from (e.g. "folders", or a seeded
      split's description; text or a dict), "skipped": files skipped (a count or a list)}`.
    - `report["settings"]`: `{name: value}`, shown as a table (containers as JSON).
    - `report["validation"]`: `classification_metrics`'s dict; its `"confusion_matrix"`
      and per-class names draw `confusion_matrix.png`.
    - `report["files"]`: `{format: {"path", "size_bytes", "accuracy" (on the validation
      images, a fraction), "top1_agreement" (with the Keras model's top-1, a fraction),
      "latency": file_latency's dict}}`.
    - `report["int8"]` (the int8 LiteRT file), `report["onnx_int8"]`,
      `report["openvino_int8"]`: `{"accuracy", "float_accuracy" (fractions),
      "accuracy_drop" (percentage points below the float model), "max_accuracy_drop" (its
      bound), "top1_agreement" (with the float model, a fraction), "test_examples",
      "path" (where written), "refused" (True, or why)}`.
    - `report["not_exported"]`: `{file name: why this install did not write it}`.
    - `report["cpu"]`: the CPU the latencies were measured on (default: this machine's,
      `cpu_name()`).
    - `report["written"]`: the "Written" line's text (default: now, in UTC).

    Args:
        output_dir: the folder to write into (created if missing).
        report: the report, as above.

    Returns:
        The paths written: `{"json", "markdown"}`, and `"confusion_matrix"` with
            validation metrics.

    Raises:
        ValueError: `report` or one of its sections is not a dict, or the validation
            metrics hold no valid confusion matrix (naming the value received).
    """
    if not isinstance(output_dir, (str, os.PathLike)):
        raise ValueError(f"`output_dir` must be a folder path. Received: output_dir={output_dir!r}")
    if not isinstance(report, dict):
        raise ValueError(f"`report` must be a dict. Received: report={report!r}")
    output_dir = os.fspath(output_dir)
    sections = {key: _section(report, key) for key in ("data", "settings", "validation")}
    files = _section(report, "files")
    int8 = {key: _section(report, key) for key in INT8_RUNTIMES}
    cpu = report.get("cpu") or cpu_name()
    written = report.get("written") or datetime.datetime.now(datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    os.makedirs(output_dir, exist_ok=True)
    paths = {}
    validation = sections["validation"]
    if validation is not None and validation.get("confusion_matrix") is not None:
        names = [entry.get("name") for entry in validation.get("per_class") or []]
        try:
            paths["confusion_matrix"] = plot_confusion_matrix(
                validation["confusion_matrix"], names, os.path.join(output_dir, CONFUSION_PNG)
            )
        except ValueError as error:
            raise ValueError(
                "`report['validation']` must hold classification_metrics's "
                f"'confusion_matrix' and 'per_class' names. {error}"
            ) from error

    lines = ["# Fine-tuning report", "", f"Written {written}.", ""]
    if sections["data"]:
        lines += _data_lines(sections["data"])
    if sections["settings"]:
        lines += _settings_lines(sections["settings"])
    if validation:
        lines += _validation_lines(validation, CONFUSION_PNG if paths else None)
    if files:
        lines += _files_lines(files, output_dir, cpu)
    for name, why in (report.get("not_exported") or {}).items():
        lines += [f"Not written: {_md(name)} ({_md(why)}).", ""]
    for key, runtime in INT8_RUNTIMES.items():
        if int8[key]:
            lines += _int8_lines(int8[key], runtime)
    markdown = "\n".join(lines).rstrip("\n") + "\n"

    def write_markdown(partial: str) -> None:
        with open(partial, "w", encoding="utf-8") as f:
            f.write(markdown)

    paths["markdown"] = write_atomically(os.path.join(output_dir, REPORT_MD), write_markdown)
    record = {**report, "cpu": cpu, "written": written}
    paths["json"] = write_json(os.path.join(output_dir, REPORT_JSON), record)
    return paths
