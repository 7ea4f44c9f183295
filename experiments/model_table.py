"""The README's model table: ShuffleNet v2 at each pretrained width, measured, then rendered.

`measure` builds `ShuffleNetV2(width)` for each width of `applications.CHECKPOINTS` at
224x224 with 1000 classes, folds it (`folding.fold_model`: the manual shuffle becomes
slices and concatenations, as any pretrained or hardened net ships), writes its float
LiteRT file (and its ONNX file where the `onnx` and `openvino` extras are installed) and
times it in the LiteRT interpreter (XNNPACK), ONNX Runtime and OpenVINO (batch 1,
`--threads`), every file checked against Keras first. Each runtime runs alone in a fresh
process (`experiments.runtime_processes`' child, importing only that runtime and NumPy), the
widths interleaved in its rounds, each timed block after as many untimed calls of the same
file: in one process beside other sessions ONNX Runtime's times moved (docs/inference.md).
`--processes` such processes per runtime, in turn (LiteRT, ONNX Runtime, OpenVINO, LiteRT,
...) so that a slow spell of the machine reaches every runtime; each cell is the median
over its processes of their medians. Weights are random:
a float32 file's size and speed do not depend on their values (and this machine has no
network for torchvision's files). Each row also holds the parameter count, the
multiply-adds (`count_macs`), the machine, its load average at the start and the end, and
the library versions.

`render` makes the markdown table from the rows and torchvision's accuracies (the
registry's, torchvision's report, not measured here); `--readme` replaces the table
between the README's `model-table` markers, `--check` fails if the README's table differs
from the rows (the test suite runs that check).

Usage:
    python -m experiments.model_table measure --json docs/results/model_table_cpu.json \
        [--note "machine busy with ..."] [--widths 0.5 1.0] [--threads 2] [--repeats 27] \
        [--processes 3]
    python -m experiments.model_table render --json docs/results/model_table_cpu.json \
        [--readme README.md] [--check]
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROWS = os.path.join("docs", "results", "model_table_cpu.json")
BEGIN = "<!-- model-table: python -m experiments.model_table render --readme README.md -->"
END = "<!-- /model-table -->"
SIDE = 224
# The export format -> its task in experiments.benchmark (the row's key: "<task>_ms").
RUNTIMES = {"onnx": "ort_infer", "openvino": "openvino_infer"}
# The runtime of each task, as experiments.runtime_processes' children name it.
CHILD_RUNTIMES = {
    "litert_infer": "litert",
    "ort_infer": "onnxruntime",
    "openvino_infer": "openvino",
}
CALLS = 10  # calls timed together in a child's block
# The optional columns: a row's key and its header.
COLUMNS = {"ort_ms": "ONNX Runtime ms", "openvino_ms": "OpenVINO ms"}


def _cpu_name():
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def measure(widths, threads, repeats, note, processes=3):
    """One row per width: parameters, multiply-adds, folded LiteRT latency and bytes."""
    import keras
    import numpy as np
    import tensorflow as tf

    from experiments.benchmark import runtime_file, runtime_functions
    from keras_autoshuffle import applications, export, folding
    from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

    load_start = os.getloadavg()[0]
    models, counts = {}, {}
    for width in widths:
        model = applications.ShuffleNetV2(width=width, input_shape=(SIDE, SIDE, 3), classes=1000)
        # Trainable parameters, as torchvision counts them (BatchNorm statistics left out).
        parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        counts[width] = (parameters, int(applications.count_macs(model)))
        models[width] = folding.fold_model(model)
    # ONNX Runtime and OpenVINO beside LiteRT where their extras are installed.
    missing = export.unsupported_formats(("onnx", "openvino"))
    tasks = ["litert_infer"] + [RUNTIMES[f] for f in ("onnx", "openvino") if f not in missing]
    with tempfile.TemporaryDirectory() as directory:
        named = {f"x{width}": model for width, model in models.items()}
        # Writes each file and checks its outputs against Keras.
        _, sizes = runtime_functions(tasks, named, SIDE, threads, directory)
        files = {
            task: {
                name: os.path.join(
                    runtime_file(directory, task, model, name),
                    *((OPENVINO_XML,) if task == "openvino_infer" else ()),
                )
                for name, model in named.items()
            }
            for task in tasks
        }
        medians = time_alone(files, threads, repeats, processes)
    machine = f"{_cpu_name()}, {os.cpu_count()} cores"
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
                "litert_ms": float(medians["litert_infer", f"x{width}"]),
                "litert_bytes": int(sizes["litert_infer", f"x{width}"]),
                **{
                    f"{task.removesuffix('_infer')}_ms": float(medians[task, f"x{width}"])
                    for task in tasks[1:]
                },
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


def _load(row):
    """The row's load averages as words, or "" where it has none."""
    if not row.get("load_average"):
        return ""
    start, end = row["load_average"]
    return f"load average {start:.1f} at the start, {end:.1f} at the end"


def render(rows, checkpoints):
    """The markdown table (and a line naming the machine) from the measured rows."""
    extra = [key for key in COLUMNS if all(key in row for row in rows)]
    lines = [
        "| model | parameters | multiply-adds | top-1 / top-5 (%) | LiteRT ms | LiteRT MB |"
        + "".join(f" {COLUMNS[key]} |" for key in extra),
        "|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    for row in sorted(rows, key=lambda r: r["width"]):
        entry = checkpoints[row["width"]]
        lines.append(
            f"| `ShuffleNetV2({row['width']})` | {row['parameters'] / 1e6:.2f}M "
            f"| {row['macs'] / 1e6:.0f}M | {entry.acc1:.1f} / {entry.acc5:.1f} "
            f"| {row['litert_ms']:.2f} | {row['litert_bytes'] / 1e6:.1f} |"
            + "".join(f" {row[key]:.2f} |" for key in extra)
        )
    settings = {
        (r["machine"], r["threads"], r["date"], r.get("tensorflow"), _load(r), r.get("note"))
        + (r.get("processes_per_runtime"),)
        for r in rows
    }
    for machine, threads, date, tf_version, load, note, processes in sorted(settings, key=str):
        timing = (
            f"each runtime alone in {processes} fresh process{'es' * (processes > 1)}, "
            "the medians' median"
            if processes
            else "timed in the same interleaved rounds"
        )
        lines.append("")
        details = "; ".join(x for x in (load, note) if x)
        lines.append(
            f"Top-1/top-5: torchvision's ImageNet-1K report for its weights, not measured here. "
            f"Latency: the folded float32 net at {SIDE}x{SIDE}, batch 1, {threads} threads, "
            f"median ms (LiteRT with XNNPACK"
            + (", and the ONNX file in ONNX Runtime and OpenVINO" if extra else "")
            + f", {timing}) on {machine} (TensorFlow {tf_version}, "
            f"{date})" + (f"; {details}" if details else "") + "."
        )
    return "\n".join(lines)


def replace_block(text, table, path):
    """`text` with the block between BEGIN and END replaced by `table`."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no model-table markers ({BEGIN!r} ... {END!r}).")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


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
    show.add_argument("--readme", help="replace the table between this file's markers")
    show.add_argument("--check", action="store_true", help="fail if --readme's table differs")
    args = parser.parse_args(argv)
    if args.command == "measure":
        if args.threads < 1:
            parser.error(f"--threads must be >= 1. Received: threads={args.threads}")
        if args.repeats < 1:
            parser.error(f"--repeats must be >= 1. Received: repeats={args.repeats}")
        if args.processes < 1:
            parser.error(f"--processes must be >= 1. Received: processes={args.processes}")
    if args.command == "render" and args.check and not args.readme:
        parser.error("--check needs --readme.")
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
        print(render(rows, CHECKPOINTS))
        return 0
    with open(args.json) as f:
        rows = json.load(f)
    table = render(rows, CHECKPOINTS)
    if not args.readme:
        print(table)
        return 0
    with open(args.readme) as f:
        text = f.read()
    new = replace_block(text, table, args.readme)
    if args.check:
        if new != text:
            print(f"{args.readme}'s model table differs from {args.json}: rerun render.")
            return 1
        return 0
    with open(args.readme, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
