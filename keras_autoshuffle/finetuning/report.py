"""The fine-tuning report: `report.json` + `report.md` in the output folder, from the
measures of `metrics.py` (validation metrics, the confusion matrix as a PNG, each exported
file's latency on this machine).

Every file is written atomically (`_atomic`): a killed run leaves the previous report or
the new one, never half of one.
"""

import datetime
import json
import os
import re

import numpy as np

from keras_autoshuffle._atomic import write_atomically, write_json
from keras_autoshuffle._validation import one_line
from keras_autoshuffle.export.int8 import INT8_RUNTIMES
from keras_autoshuffle.finetuning.metrics import (  # noqa: F401 (the report's measures, as before)
    classification_metrics,
    cpu_name,
    file_latency,
    plot_confusion_matrix,
)

REPORT_JSON, REPORT_MD, CONFUSION_PNG = "report.json", "report.md", "confusion_matrix.png"


def _md(value) -> str:
    """`value` as Markdown text on one line, its characters with a meaning there escaped:
    `|` would end a table cell, `*` or `_` start emphasis, `<` HTML, `[` a link, `$` a
    formula on GitHub. `-`, `#` and the like only matter at the start of a line, where no
    such text goes, and `_` inside a word (golden_retriever) starts nothing: both stay, so
    the raw file reads as well as the rendered one."""
    text = re.sub(r"[\\`*<>|~$\[\]]", lambda match: "\\" + match.group(), one_line(value))
    return re.sub(r"(?<![^\W_])_|_(?![^\W_])", r"\\_", text)


def _code(value) -> str:
    """`value` as a Markdown code span on one line (file names, settings: nothing in it is
    formatting; `|` still escaped, or it would end a table cell)."""
    text = one_line(value).replace("|", "\\|")
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
