"""The README's model table: ShuffleNet v2 at each pretrained width, measured, then rendered.

`measure` builds `ShuffleNetV2(width)` for each width of `applications.CHECKPOINTS` at
224x224 with 1000 classes, folds it (`folding.fold_model`: the manual shuffle becomes
slices and concatenations, as any pretrained or hardened net ships) and writes it with
`export.export_model`: its float LiteRT file (and its ONNX file and OpenVINO folder where
the `onnx` and `openvino` extras are installed), every file checked against Keras, and
with `quantize="int8"` the full-integer file of each (int8 weights and activations, float32
input and output: `model_int8.tflite`, `model_int8.onnx`, and `openvino_int8/` where NNCF,
the `openvino-int8` extra, is installed). The int8 files are calibrated on
`INT8_CALIBRATION` seeded random images of the input's scale (normal, as the preprocessed
inputs); their check's agreement and accuracy mean nothing with random weights, so its
limits are opened (as `experiments.int8_peers`), and the rendered agreement comes from a
trained net instead (`render`, below). Each file is timed in the LiteRT interpreter
(XNNPACK), ONNX Runtime or OpenVINO (batch 1, `--threads`). Each runtime runs alone in a
fresh process (`experiments.runtime_processes`' child, importing only that runtime and
NumPy), the widths' float and int8 files interleaved in its rounds (a new order each
round), each timed block after as many untimed calls of the same file: in one process
beside other sessions ONNX Runtime's times moved (docs/inference.md). `--processes` such
processes per runtime, in turn (LiteRT, ONNX Runtime, OpenVINO, LiteRT, ...) so that a slow
spell of the machine reaches every runtime; each cell is the median over its processes of
their medians. Weights are random: a file's size and speed, float32 or int8, do not depend
on their values (and this machine has no network for torchvision's files). Each row holds
the parameter count, the multiply-adds (`count_macs`), the float times (`litert_ms`, `ort_ms`,
`openvino_ms`) and LiteRT bytes, each int8 file's `<runtime>_int8_ms` and
`<runtime>_int8_bytes` (`export.size_bytes`; keys absent where a quantizer or runtime is
not installed) and `int8_calibration_images`, the machine, its load average at the start
and the end, and the library versions.

`render` makes the markdown table from the weights registry (`applications.CHECKPOINTS`:
names, parameters, multiply-adds, torchvision's accuracies, not measured here) and the rows'
times and file sizes, refusing a row whose counts differ from its entry's; its caption
names the machine, the threads and the versions, while the run's facts (date, load averages,
`--note`) stay in the rows, not on the front page. Where every row
holds a runtime's int8 ms and bytes, a second table right under it gives each width's int8
ms and MB in those runtimes, and a caption after the machine's line gives each runtime's
int8 top-1 agreement with float and accuracy drop (mean and 95% interval over calibration
seeds) from `--accuracy` (a file in `experiments.int8_accuracy`'s form; default: the
export's default files in the repository's `docs/results/int8_levers_minmax.json`,
`int8_claims.fm_defaults`: ShuffleNet v2 0.5x trained on Fashion-MNIST, since ImageNet is
not available here); rows without int8 keys render the float table alone.
`--readme` replaces both tables between the README's `model-table` markers
(docs/inference.md includes that block, pymdownx.snippets), `--guide` the registry's table between
docs/guide/pretrained.md's `weights-table` markers (`render_weights`), and `--check` fails
if either differs (the test suite runs that check).

Usage:
    python -m experiments.model_table measure --json docs/results/model_table_cpu.json \
        [--note "machine busy with ..."] [--widths 0.5 1.0] [--threads 2] [--repeats 27] \
        [--processes 3]
    python -m experiments.model_table render --json docs/results/model_table_cpu.json \
        [--accuracy INT8_ACCURACY.json] [--readme README.md] \
        [--guide docs/guide/pretrained.md] [--check]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROWS = os.path.join("docs", "results", "model_table_cpu.json")
BEGIN = "<!-- model-table: python -m experiments.model_table render --readme README.md -->"
END = "<!-- /model-table -->"
# The guide's table of the registry (`render_weights`), between these markers.
GUIDE = os.path.join("docs", "guide", "pretrained.md")
WEIGHTS_BEGIN = (
    "<!-- weights-table: python -m experiments.model_table render --guide "
    "docs/guide/pretrained.md -->"
)
WEIGHTS_END = "<!-- /weights-table -->"
# export_model's int8 results at its defaults: int8_levers' rows of its base setting.
ACCURACY = os.path.join("docs", "results", "int8_levers_minmax.json")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDE = 224
# The export format -> its task (the row's keys: "<task less _infer>_ms", and "_int8_ms",
# "_int8_bytes" for its int8 file).
TASKS = {"litert": "litert_infer", "onnx": "ort_infer", "openvino": "openvino_infer"}
# The export format -> its int8 file's key in export_model's result (files.INT8_FILES).
INT8_KEYS = {"litert": "int8", "onnx": "onnx_int8", "openvino": "openvino_int8"}
# Seeded random images calibrating each int8 file; the first INT8_TEST of them are its
# check's test images (random weights: only size and speed are measured).
INT8_CALIBRATION = 32
INT8_TEST = 8
# The runtime of each task, as experiments.runtime_processes' children name it.
CHILD_RUNTIMES = {
    "litert_infer": "litert",
    "ort_infer": "onnxruntime",
    "openvino_infer": "openvino",
}
CALLS = 10  # calls timed together in a child's block
# The optional columns: a row's key and its header.
COLUMNS = {"ort_ms": "ONNX Runtime ms", "openvino_ms": "OpenVINO ms"}
# The int8 table's runtimes: the rows' key prefix -> (header, key in the int8 accuracy
# summary). A runtime's columns are "<prefix>_int8_ms" and "<prefix>_int8_bytes".
INT8_COLUMNS = {
    "litert": ("LiteRT", "litert"),
    "ort": ("ONNX Runtime", "onnx"),
    "openvino": ("OpenVINO", "openvino"),
}
# What the int8 accuracy rows were measured on (experiments/int8_levers.py's usage).
ACCURACY_NET = "ShuffleNet v2 0.5x trained on Fashion-MNIST"


def time_alone(files, threads, rounds, processes):
    """{(task, name): median ms}: the files {task: {name: path}} of each runtime timed in
    fresh processes of their own (see the module docstring)."""
    from experiments.runtime_processes import run_child

    per_process = {}
    for seed in range(processes):
        for task, named in files.items():
            # As many untimed calls of the same file before each timed block (docs/inference.md:
            # a session's spinning threads slow the next session's block).
            settings = (threads, rounds, CALLS, seed, 0.0, SIDE, CALLS)
            row = run_child(CHILD_RUNTIMES[task], named, *settings, against_first=True)
            for name, ms in row["median_ms"].items():
                per_process.setdefault((task, name), []).append(ms)
    return {key: statistics.median(values) for key, values in per_process.items()}


def _write_files(model, directory, formats, int8_formats):
    """`model`'s float files of `formats` and int8 files of `int8_formats`, written into
    `directory` by `export.export_model` (each float file checked against Keras, each int8
    one by the int8 check with its limits opened: see the module docstring): {format or
    int8 result key: path}."""
    import numpy as np

    from keras_autoshuffle import export

    rng = np.random.default_rng(0)
    sample = rng.normal(size=(1, SIDE, SIDE, 3)).astype("float32")
    calibration = rng.normal(size=(INT8_CALIBRATION, SIDE, SIDE, 3)).astype("float32")
    result = export.export_model(
        model,
        directory,
        sample,
        formats=formats,
        **(
            {
                "quantize": "int8",
                "int8_formats": int8_formats,
                "representative_data": calibration,
                # Labels and agreement mean nothing with random weights: the limits are open.
                "test_data": (calibration[:INT8_TEST], np.zeros(INT8_TEST, "int64")),
                "max_accuracy_drop": 100.0,
            }
            if int8_formats
            else {}
        ),
    )
    return {key: entry["path"] for key, entry in result.items()}


def measure(widths, threads, repeats, note, processes=3):
    """One row per width: parameters, multiply-adds, the folded net's float and int8 files'
    latency and bytes in each runtime installed."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_autoshuffle import applications, export, folding
    from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML
    from keras_autoshuffle.finetuning.metrics import cpu_name

    load_start = os.getloadavg()[0]
    models, counts = {}, {}
    for width in widths:
        model = applications.ShuffleNetV2(width=width, input_shape=(SIDE, SIDE, 3), classes=1000)
        # Trainable parameters, as torchvision counts them (BatchNorm statistics left out).
        parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        counts[width] = (parameters, int(applications.count_macs(model)))
        models[width] = folding.fold_model(model)
    # ONNX Runtime and OpenVINO beside LiteRT where their extras are installed; an int8 file
    # of each where its quantizer is (NNCF for OpenVINO).
    missing = export.unsupported_formats(("onnx", "openvino"))
    formats = ["litert"] + [f for f in ("onnx", "openvino") if f not in missing]
    int8_formats = [f for f in formats if f not in export.unsupported_int8(formats)]
    tasks = [TASKS[f] for f in formats]
    with tempfile.TemporaryDirectory() as directory:
        files, sizes = {task: {} for task in tasks}, {}
        for width, model in models.items():
            paths = _write_files(model, os.path.join(directory, f"x{width}"), formats, int8_formats)
            for fmt in formats:
                task = TASKS[fmt]
                for name, key in ((f"x{width}", fmt), (f"x{width}_int8", INT8_KEYS[fmt])):
                    if key not in paths:
                        continue
                    sizes[task, name] = export.size_bytes(paths[key])
                    # OpenVINO's runtime reads the folder's model.xml.
                    files[task][name] = os.path.join(
                        paths[key], *((OPENVINO_XML,) if fmt == "openvino" else ())
                    )
        # Float and int8 files in the same processes and rounds, in a new order each round.
        medians = time_alone(files, threads, repeats, processes)
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    # The 1-minute load average at the start and the end: how busy the machine was.
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    try:
        from importlib.metadata import version

        versions["ai-edge-litert"] = version("ai-edge-litert")
    except Exception:  # the interpreter may come from TensorFlow itself
        pass
    rows = []
    for width in widths:
        parameters, macs = counts[width]
        name = f"x{width}"
        int8 = {}
        for fmt in int8_formats:
            task = TASKS[fmt]
            prefix = task.removesuffix("_infer")
            int8[f"{prefix}_int8_ms"] = float(medians[task, f"{name}_int8"])
            int8[f"{prefix}_int8_bytes"] = int(sizes[task, f"{name}_int8"])
        rows.append(
            {
                "model": "ShuffleNetV2",
                "width": width,
                "input": SIDE,
                "batch": 1,
                "threads": threads,
                "processes_per_runtime": processes,
                "parameters": parameters,
                "macs": macs,
                "litert_ms": float(medians["litert_infer", name]),
                "litert_bytes": int(sizes["litert_infer", name]),
                **{
                    f"{task.removesuffix('_infer')}_ms": float(medians[task, name])
                    for task in tasks[1:]
                },
                **int8,
                **({"int8_calibration_images": INT8_CALIBRATION} if int8 else {}),
                **(
                    {"openvino_precision": export.OPENVINO_PRECISION}
                    if "openvino_infer" in tasks
                    else {}
                ),
                "machine": machine,
                "load_average": load,
                "note": note,
                "date": datetime.date.today().isoformat(),
                **versions,
            }
        )
    return rows


def _entries():
    """The registry's entries (`applications.CHECKPOINTS`), by width."""
    from keras_autoshuffle.applications import CHECKPOINTS

    return [CHECKPOINTS[width] for width in sorted(CHECKPOINTS)]


def _int8_table(entries, by_width, prefixes):
    """The int8 table's lines: per registry entry, each runtime's (`prefixes`) int8 ms and
    MB from the row of its width ("-" where none was measured)."""
    lines = [
        "| int8 model |"
        + "".join(f" {INT8_COLUMNS[p][0]} ms | {INT8_COLUMNS[p][0]} MB |" for p in prefixes),
        "|---|" + "---|---|" * len(prefixes),
    ]
    for entry in entries:
        row = by_width.get(entry.width)
        measured = ["-"] * (2 * len(prefixes))
        if row is not None:
            measured = []
            for p in prefixes:
                measured += [f"{row[f'{p}_int8_ms']:.2f}", f"{row[f'{p}_int8_bytes'] / 1e6:.1f}"]
        lines.append(f"| `{entry.builder}({entry.width})` | " + " | ".join(measured) + " |")
    return lines


def _interval(value, scale, unit=""):
    """A summary entry {"mean", "ci95"} as "mean<unit> [low, high]", each times `scale`."""
    low, high = (x * scale for x in value["ci95"])
    return f"{value['mean'] * scale:.2f}{unit} [{low:.2f}, {high:.2f}]"


def _int8_text(rows, prefixes, accuracy):
    """The int8 table's caption: how the files were written and timed, then each runtime's
    top-1 agreement and accuracy drop from `accuracy` (`int8_claims.fm_defaults`' form), and
    what those were measured on."""
    counts = {r.get("int8_calibration_images") for r in rows}
    count = counts.pop() if len(counts) == 1 else None
    images = f"{count} seeded random images" if count else "seeded random images"
    text = (
        "int8: the folded net's full-integer files (int8 weights and activations, float32 input "
        'and output) written by `export.export_model(..., quantize="int8")` (LiteRT\'s '
        "converter, ONNX Runtime's `quantize_static`, NNCF for OpenVINO), calibrated on "
        f"{images} of the input's scale (the weights are random: a file's size and speed do "
        "not depend on their values), timed in the same processes and rounds as the float "
        "files; MB: the file's (OpenVINO: its folder's) bytes / 10^6."
    )
    summary = accuracy.get("summary", {})
    found = [p for p in prefixes if INT8_COLUMNS[p][1] in summary]
    if not found:
        return text
    settings = accuracy.get("settings", {})
    cells = []
    for p in found:
        entry = summary[INT8_COLUMNS[p][1]]
        cells.append(
            f"{INT8_COLUMNS[p][0]} {_interval(entry['top1_agreement'], 100, '%')}, "
            f"{_interval(entry['accuracy_drop'], 1)}"
        )
    seeds = sorted({summary[INT8_COLUMNS[p][1]]["seeds"] for p in found})
    seeds = "/".join(str(n) for n in seeds)
    per_seed = settings.get("calibration_images")
    tests = settings.get("test_images")
    return (
        f"{text} Top-1 agreement of each runtime's int8 file with the float32 net, and its "
        "accuracy drop in points: "
        + "; ".join(cells)
        + f" (mean [95% t interval] over {seeds} calibration seeds"
        + (f" of {per_seed:,} training images" if per_seed else "")
        + (f", on the {tests:,} test images" if tests else "")
        + f"), measured not on ImageNet (not available here) but on {ACCURACY_NET} "
        f"(`{ACCURACY}`, its default setting, `python -m experiments.int8_levers`)."
    )


def render(rows, accuracy=None):
    """The README's markdown table (and a line naming the machine): one line per registry
    entry, its parameters, multiply-adds and accuracy from the registry, its times and file
    size from the measured row of its width ("-" where none was measured). A row whose
    parameters or multiply-adds differ from its entry's is refused: one number per claim.

    Where every row holds a runtime's int8 ms and bytes, a second table right under the
    first gives them per entry, and a caption after the machine's line gives the int8
    files' top-1 agreement with float and accuracy drop per runtime from `accuracy`
    (`int8_claims.fm_defaults`' form; default: the repository's `ACCURACY` file)."""
    by_width = {row["width"]: row for row in rows}
    entries = _entries()
    for row in rows:
        entry = next((e for e in entries if e.width == row["width"]), None)
        if entry is None:
            raise ValueError(f"No registry entry has width {row['width']}. Received: {row}")
        # The registry's multiply-adds are at 224x224; a row at another side has others.
        at_224 = row.get("input", SIDE) == 224
        if row["parameters"] != entry.num_params or (at_224 and row["macs"] != entry.macs):
            raise ValueError(
                f"The row of width {row['width']} counts {row['parameters']} parameters and "
                f"{row['macs']} multiply-adds; the registry's {entry.name} holds "
                f"{entry.num_params} and {entry.macs}. Measure again or fix the registry. "
                f"Received: parameters={row['parameters']}, macs={row['macs']}"
            )
    extra = [key for key in COLUMNS if all(key in row for row in rows)]
    lines = [
        "| model | weights | parameters | multiply-adds | top-1 / top-5 (%) | LiteRT ms "
        "| LiteRT MB |" + "".join(f" {COLUMNS[key]} |" for key in extra),
        "|---|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    for entry in entries:
        row = by_width.get(entry.width)
        measured = ["-"] * (2 + len(extra))
        if row is not None:
            measured = [f"{row['litert_ms']:.2f}", f"{row['litert_bytes'] / 1e6:.1f}"]
            measured += [f"{row[key]:.2f}" for key in extra]
        lines.append(
            f"| `{entry.builder}({entry.width})` | `{entry.name}` "
            f"| {entry.num_params / 1e6:.2f}M | {entry.macs / 1e6:.0f}M "
            f"| {entry.acc1:.1f} / {entry.acc5:.1f} | " + " | ".join(measured) + " |"
        )
    int8 = [
        p
        for p in INT8_COLUMNS
        if rows and all(f"{p}_int8_ms" in r and f"{p}_int8_bytes" in r for r in rows)
    ]
    if int8:
        lines += ["", *_int8_table(entries, by_width, int8)]
    # What the reader needs to compare the times (the machine, its threads, the versions);
    # the run's facts (its date, load averages, `--note`) stay in the rows.
    settings = {
        (r["machine"], r["threads"], r.get("tensorflow"), r.get("processes_per_runtime"))
        for r in rows
    }
    for machine, threads, tf_version, processes in sorted(settings, key=str):
        timing = (
            f"each runtime alone in {processes} fresh process{'es' * (processes > 1)}, "
            "the medians' median"
            if processes
            else "timed in the same interleaved rounds"
        )
        lines.append("")
        lines.append(
            "Parameters, multiply-adds and top-1/top-5: the weights registry "
            "(`applications.CHECKPOINTS`); top-1/top-5 are torchvision's ImageNet-1K "
            "report for its weights, not measured here. "
            f"Latency: the folded float32 net at {SIDE}x{SIDE}, batch 1, {threads} threads, "
            f"median ms (LiteRT with XNNPACK"
            + (", and the ONNX file in ONNX Runtime and OpenVINO" if extra else "")
            + f", {timing}) on {machine} (TensorFlow {tf_version}; the run's date and the "
            "machine's load: in the rows)."
        )
    if int8:
        if accuracy is None:
            from experiments import int8_claims

            accuracy = int8_claims.fm_defaults(REPOSITORY)
        lines += ["", _int8_text(rows, int8, accuracy)]
    return "\n".join(lines)


def render_weights():
    """The guide's table of the registry alone (docs/guide/pretrained.md): each entry's
    name, file, size, parameters, multiply-adds, accuracy, evaluation sizes and hash."""
    lines = [
        "| weights | torchvision's file | size | parameters | multiply-adds "
        "| acc@1 / acc@5 (%) | resize / crop | SHA-256 checked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in _entries():
        checked = "all 64 digits" if len(entry.sha256) == 64 else f"prefix `{entry.sha256}`"
        lines.append(
            f"| `{entry.name}` | `{entry.file_name}` | {entry.file_size / 2**20:.1f} MiB "
            f"| {entry.num_params:,} | {entry.macs / 1e6:.0f}M "
            f"| {entry.acc1:.3f} / {entry.acc5:.3f} | {entry.resize_size} / {entry.crop_size} "
            f"| {checked} |"
        )
    return "\n".join(lines)


def replace_block(text, table, path, begin=BEGIN, end=END):
    """`text` with the block between `begin` and `end` replaced by `table`."""
    if begin not in text or end not in text:
        kind = "model-table" if begin == BEGIN else "weights-table"
        raise ValueError(f"{path} has no {kind} markers ({begin!r} ... {end!r}).")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="build, fold, export and time each width")
    run.add_argument("--json", default=ROWS, help="where the rows go")
    run.add_argument("--widths", nargs="+", type=float, default=None)
    run.add_argument("--threads", type=int, default=2, help="threads of each runtime")
    run.add_argument("--repeats", type=int, default=27, help="rounds in each process")
    run.add_argument("--processes", type=int, default=3, help="processes per runtime")
    run.add_argument("--note", default="", help="the machine's state, kept in each row")
    show = commands.add_parser("render", help="the markdown table from the rows")
    show.add_argument("--json", default=ROWS, help="the measured rows")
    show.add_argument(
        "--accuracy",
        help="a file in experiments.int8_accuracy's form for the int8 caption (default: the "
        f"export's default files in the repository's {ACCURACY})",
    )
    show.add_argument("--readme", help="replace the table between this file's markers")
    show.add_argument("--guide", help="replace the registry table between this file's markers")
    show.add_argument(
        "--check", action="store_true", help="fail if --readme's or --guide's table differs"
    )
    args = parser.parse_args(argv)
    if args.command == "measure":
        if args.threads < 1:
            parser.error(f"--threads must be >= 1. Received: threads={args.threads}")
        if args.repeats < 1:
            parser.error(f"--repeats must be >= 1. Received: repeats={args.repeats}")
        if args.processes < 1:
            parser.error(f"--processes must be >= 1. Received: processes={args.processes}")
    if args.command == "render" and args.check and not (args.readme or args.guide):
        parser.error("--check needs --readme or --guide.")
    return args


def main(argv=None):
    args = parse_args(argv)
    from keras_autoshuffle.applications import CHECKPOINTS

    if args.command == "measure":
        widths = args.widths or sorted(CHECKPOINTS)
        unknown = [w for w in widths if w not in CHECKPOINTS]
        if unknown:
            raise SystemExit(f"No checkpoint for width {unknown}. Received: widths={widths}")
        rows = measure(widths, args.threads, args.repeats, args.note, args.processes)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(render(rows))
        return 0
    with open(args.json) as f:
        rows = json.load(f)
    accuracy = None
    if args.accuracy:
        with open(args.accuracy) as f:
            accuracy = json.load(f)
    pages = [
        (args.readme, render(rows, accuracy), BEGIN, END),
        (args.guide, render_weights(), WEIGHTS_BEGIN, WEIGHTS_END),
    ]
    if not args.readme and not args.guide:
        print(pages[0][1])
        return 0
    status = 0
    for path, table, begin, end in pages:
        if not path:
            continue
        with open(path) as f:
            text = f.read()
        new = replace_block(text, table, path, begin, end)
        if args.check:
            if new != text:
                print(f"{path}'s table differs from the registry and {args.json}: rerun render.")
                status = 1
            continue
        with open(path, "w") as f:
            f.write(new)
    return status


if __name__ == "__main__":
    sys.exit(main())
