"""Side-by-side speed of manual, relaxed, hardened and folded shuffles.

In one process, interleaved and repeated (warm-up, then the median of `--repeats`
samples, the variants in a new random order every round), for ShuffleNet v1 g3 1.0x and v2 1.0x:

- train_step: a `train_on_batch` step, manual vs relaxed, at 32x32 batch 128 (CIFAR
  stem) and 224x224 batch 32;
- keras_infer: a traced `model(x, training=False)` (tf.function) at 224x224, batch 1
  and 64;
- litert_infer: the LiteRT interpreter (XNNPACK) at 224x224, batch 1, `--threads` 2;
- ort_infer, openvino_infer: ONNX Runtime (CPU) and OpenVINO (CPU, latency hint, float32:
  `export.openvino_model`'s INFERENCE_PRECISION_HINT f32, named in each openvino_infer row's
  `openvino_precision`; OpenVINO's own default is bfloat16 on CPUs with bf16 units) on the
  package's ONNX / OpenVINO files (`export.export_onnx`, `export.export_openvino`: NCHW
  graphs written from the layers), same input and threads. The three runtimes' calls are
  timed in the same interleaved rounds, each file's outputs checked against Keras first
  (1e-4).

`--torchvision DIR` (v2 1.0x only) adds torchvision's own graph: DIR holds what
`experiments/torchvision_onnx.py` writes with a scratch install of torch and torchvision
(`torch.onnx.export`, opset 17, seeded weights and BatchNorm statistics): `torchvision.onnx`,
its `state_dict.npz` and `check.npz` (an input and torch's logits). The package's v2 1.0x is
then `ShuffleNetV2(1.0, stem="imagenet", classifier_activation=None)` with those weights
(`load_torchvision_weights`), its Keras outputs and each runtime's checked against torch's
logits, and the table below the rows gives each runtime's medians over torchvision's in
ONNX Runtime.

Each row keeps its rounds (`rounds_ms`). Variants timed in the same rounds are compared
round by round: the tables' ratios are the median of the per-round ratios with a 95%
bootstrap interval (`paired_ratio`), which a load that comes and goes during the run
disturbs far less than a ratio of two medians.

Variants: manual (ChannelShuffle), manual_folded (the manual net through `fold_model`:
v1 keeps the reshape-transpose, v2 routes by slices and concats, as a hardened net),
manual_same_padding (the manual net built with `padding="same"`: Keras's 'same' on the
stride-2 layers instead of PyTorch's padding, no PAD ops), relaxed (dense N x N
shuffle), hardened_gather (a randomly initialised relaxed matrix rounded to its nearest
permutation: a GATHER),
hardened_folded (the same, folded by `fold_model`), balanced_folded (balanced
hardening of such a matrix, folded: v1 keeps the manual reshape-transpose, v2 one
SPLIT and one CONCAT per unit), no_shuffle (the manual net with Identity in place of each
shuffle: the floor) and folded_int8 (hardened_folded as full-integer LiteRT,
`export.export_int8`, calibrated on random images; LiteRT only, timed in the same rounds as
the float files). The LiteRT files' sizes in bytes are printed on a `#` line.

Usage:
    python -m experiments.benchmark [--quick] [--json rows.json] [--tasks litert_infer]
        [--models v2] [--variants manual hardened_folded] [--torchvision DIR]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from experiments.timing import measure, paired_ratio  # noqa: E402
from keras_autoshuffle import ChannelShuffle, export, folding, harden_model  # noqa: E402
from keras_autoshuffle.applications import (  # noqa: E402
    AutoShuffleNetV1,
    AutoShuffleNetV2,
    load_torchvision_weights,
)

TASKS = ("train_step", "keras_infer", "litert_infer", "ort_infer", "openvino_infer")
# Without --tasks: ort_infer and openvino_infer need the onnx / openvino extras.
DEFAULT_TASKS = ("train_step", "keras_infer", "litert_infer")
# Timed together, in the same interleaved rounds.
RUNTIME_TASKS = ("litert_infer", "ort_infer", "openvino_infer")
# Largest difference from Keras (and from torch's logits) allowed in a runtime's outputs.
OUTPUT_TOLERANCE = 1e-4
VARIANTS = (
    "manual",
    "manual_folded",
    "manual_same_padding",
    "relaxed",
    "hardened_gather",
    "hardened_folded",
    "balanced_folded",
    "no_shuffle",
    "folded_int8",
)
TRAIN_VARIANTS = ("manual", "relaxed")
# LiteRT-only variants (no Keras timing): int8 is a property of the converted file.
INT8_VARIANTS = ("folded_int8",)


def model_specs(quick):
    """{model name: (builder, kwargs)}: the issue's two nets, or tiny ones for --quick."""
    if quick:
        return {
            "v1_g3_0.25": (AutoShuffleNetV1, {"groups": 3, "width": 0.25}),
            "v2_0.5": (AutoShuffleNetV2, {"width": 0.5}),
        }
    return {
        "v1_g3_1.0": (AutoShuffleNetV1, {"groups": 3, "width": 1.0}),
        "v2_1.0": (AutoShuffleNetV2, {"width": 1.0}),
    }


def _no_shuffle(model):
    """The same net with `Identity` in place of each ChannelShuffle."""

    def clone(layer):
        if isinstance(layer, ChannelShuffle):
            return keras.layers.Identity(name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(model, clone_function=clone)


def load_torchvision(directory):
    """(torchvision.onnx path, state dict, NCHW input, torch's logits) from `directory`."""
    names = ("torchvision.onnx", "state_dict.npz", "check.npz")
    missing = [n for n in names if not os.path.isfile(os.path.join(directory, n))]
    if missing:
        raise SystemExit(
            f"error: --torchvision {directory} lacks {missing}: write it with "
            "experiments/torchvision_onnx.py"
        )
    with np.load(os.path.join(directory, "state_dict.npz")) as f:
        state_dict = dict(f)
    with np.load(os.path.join(directory, "check.npz")) as f:
        x, logits = f["x"], f["logits"]
    return os.path.join(directory, names[0]), state_dict, x, logits


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))


def build_variants(name, spec, side, classes, variants, time_limit, torchvision=None):
    """{variant: model} for one net at `side` x `side` input (with `torchvision`, its
    weights in the manual net, and through it in manual_folded and no_shuffle)."""
    builder, kwargs = spec
    common = {**kwargs, "input_shape": (side, side, 3), "classes": classes}
    if torchvision is not None:
        common.update(stem="imagenet", classifier_activation=None)
    models = {}
    manual = builder(shuffle="manual", **common)
    if torchvision is not None:
        _, state_dict, x, logits = torchvision
        load_torchvision_weights(manual, state_dict)
        diff = _max_diff(export.keras_outputs(manual, x.transpose(0, 2, 3, 1)), logits)
        print(f"# {name}: Keras vs torch logits, max |diff| {diff:.2e}", flush=True)
        if not diff <= OUTPUT_TOLERANCE:
            raise SystemExit(f"error: the Keras net differs from torch's by {diff:.3e}")
    for variant in variants:
        if variant == "manual":
            models[variant] = manual
        elif variant == "manual_folded":
            models[variant] = folding.fold_model(manual)
        elif variant == "manual_same_padding":
            models[variant] = builder(shuffle="manual", padding="same", **common)
        elif variant == "relaxed":
            models[variant] = builder(shuffle="auto", **common)
        elif variant in ("hardened_gather", "hardened_folded", "folded_int8"):
            if "hardened" not in models:
                models["hardened"] = builder(shuffle="auto", **common)
                harden_model(models["hardened"])
            model = models["hardened"]
            folded = variant != "hardened_gather"
            models[variant] = folding.fold_model(model) if folded else model
        elif variant == "balanced_folded":
            model = builder(shuffle="auto", **common)
            start = time.perf_counter()
            harden_model(model, balanced=True, time_limit=time_limit)
            print(f"# {name}: balanced hardening {time.perf_counter() - start:.1f} s", flush=True)
            models[variant] = folding.fold_model(model)
        elif variant == "no_shuffle":
            models[variant] = _no_shuffle(manual)
            models[variant].set_weights(manual.get_weights())
    models.pop("hardened", None)
    return models


def train_functions(models, side, batch, classes):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, side, side, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, classes, size=(batch,)))
    functions = {}
    for variant, model in models.items():
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
        functions[variant] = lambda m=model: m.train_on_batch(x, y)
    return functions


def keras_functions(models, side, batch):
    x = tf.constant(np.random.default_rng(0).normal(size=(batch, side, side, 3)), tf.float32)
    functions = {}
    for variant, model in models.items():
        if variant in INT8_VARIANTS:
            continue
        call = tf.function(lambda inputs, m=model: m(inputs, training=False))
        functions[variant] = lambda c=call: c(x).numpy()
    return functions


def _runtime_call(task, model, path, threads, calibration=None):
    """(timed call, outputs function, file bytes) of `model` written for `task` at `path`."""
    if task == "litert_infer":
        if calibration is not None:
            export.export_int8(model, path, calibration)
        else:
            export.export_litert(model, path)
        runner = export.open_runner(path, threads)
        return runner.run, runner.size_bytes
    if task == "ort_infer":
        if model is not None:
            export.export_onnx(model, path)
        runner = export.open_runner(path, threads)
        return runner.run, runner.size_bytes
    if model is not None:
        export.export_openvino(model, path)
    # OpenVINO itself also for torchvision's `.onnx` file (open_runner would use ONNX Runtime).
    compiled = export.openvino_model(path, threads, precision=export.OPENVINO_PRECISION)
    size = sum(e.stat().st_size for e in os.scandir(path)) if os.path.isdir(path) else 0
    return lambda x: compiled(x)[compiled.outputs[0]], size


_SUFFIX = {"litert_infer": ".tflite", "ort_infer": ".onnx", "openvino_infer": ""}


def runtime_file(directory, task, model, variant):
    """Where `runtime_functions` writes `model`'s file for `task` (OpenVINO: a folder)."""
    return os.path.join(directory, f"{model.name}_{variant}{_SUFFIX[task]}")


def runtime_functions(tasks, models, side, threads, directory, torchvision=None):
    """({(task, variant): timed call}, {(task, variant): file bytes}) for the runtime tasks,
    every file's outputs checked first against Keras (and torchvision's against torch)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, side, side, 3)).astype("float32")
    if torchvision is not None:
        x = torchvision[2].transpose(0, 2, 3, 1).copy()
    calibration = rng.normal(size=(8, side, side, 3)).astype("float32")
    functions, sizes = {}, {}
    for task in tasks:
        for variant, model in models.items():
            if variant in INT8_VARIANTS and task != "litert_infer":
                continue
            path = runtime_file(directory, task, model, variant)
            int8 = calibration if variant in INT8_VARIANTS else None
            call, sizes[task, variant] = _runtime_call(task, model, path, threads, int8)
            if variant not in INT8_VARIANTS:
                diff = _max_diff(call(x), export.keras_outputs(model, x))
                if not diff <= OUTPUT_TOLERANCE:
                    raise SystemExit(f"error: {task} {variant} differs from Keras by {diff:.3e}")
            functions[task, variant] = lambda c=call: c(x)
        if torchvision is not None and task != "litert_infer":
            call, sizes[task, "torchvision"] = _runtime_call(task, None, torchvision[0], threads)
            nchw = np.ascontiguousarray(torchvision[2])
            diff = _max_diff(call(nchw), torchvision[3])
            print(f"# {task} torchvision vs torch logits, max |diff| {diff:.2e}", flush=True)
            if not diff <= OUTPUT_TOLERANCE:
                raise SystemExit(f"error: {task} torchvision differs from torch by {diff:.3e}")
            functions[task, "torchvision"] = lambda c=call, a=nchw: c(a)
    return functions, sizes


def _ratio_text(row, base):
    """`row`'s time over `base`'s: the median of the per-round ratios with its 95% interval
    where both carry their rounds (timed together), else the ratio of the medians."""
    paired = paired_ratio(row.get("rounds_ms"), base.get("rounds_ms") or ())
    if paired is None:
        return f"{row['median_ms'] / base['median_ms']:.2f}"
    return "{:.2f}, {:.2f}-{:.2f}".format(*paired)


def runtime_table(rows):
    """A markdown table per model: runtimes by variants, median ms and the ratio to
    torchvision's graph in ONNX Runtime (to manual's there without --torchvision); below
    it, folded over manual in each runtime."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows if r["task"] in RUNTIME_TASKS):
        cells = {
            (r["task"], r["variant"]): r
            for r in rows
            if r["model"] == model and r["task"] in RUNTIME_TASKS
        }
        variants = list(dict.fromkeys(v for _, v in cells))
        variants.sort(key=lambda v: v != "torchvision")
        reference = "torchvision" if ("ort_infer", "torchvision") in cells else "manual"
        base = cells.get(("ort_infer", reference))
        lines += [
            f"\n{model}: median ms (ratio to {reference} in ONNX Runtime; with the rounds, "
            "the median of the per-round ratios and its 95% bootstrap interval)",
            "| runtime | " + " | ".join(variants) + " |",
            "|---" * (len(variants) + 1) + "|",
        ]
        folded = []
        for task in RUNTIME_TASKS:
            if not any(t == task for t, _ in cells):
                continue
            row = []
            for v in variants:
                cell = cells.get((task, v))
                ratio = f" ({_ratio_text(cell, base)})" if cell and base else ""
                row.append("-" if cell is None else f"{cell['median_ms']:.2f}{ratio}")
            lines.append(f"| {task} | " + " | ".join(row) + " |")
            manual, fold = cells.get((task, "manual")), cells.get((task, "manual_folded"))
            if manual and fold:
                folded.append(f"{task} {_ratio_text(fold, manual)}")
        if folded:
            lines.append("\nmanual_folded / manual: " + "; ".join(folded))
    return "\n".join(lines)


def markdown(rows):
    """A markdown table with each row's ratio to manual (and to no_shuffle)."""
    lines = [
        "| task | model | input | batch | variant | median ms | / manual | / no_shuffle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = {}
    for row in rows:
        key = (row["task"], row["model"], row["input"], row["batch"])
        base.setdefault(key, {})[row["variant"]] = row["median_ms"]
    for row in rows:
        key = (row["task"], row["model"], row["input"], row["batch"])
        manual, floor = base[key].get("manual"), base[key].get("no_shuffle")
        ratio = f"{row['median_ms'] / manual:.3f}" if manual else ""
        to_floor = f"{row['median_ms'] / floor:.3f}" if floor else ""
        lines.append(
            f"| {row['task']} | {row['model']} | {row['input']} | {row['batch']} | "
            f"{row['variant']} | {row['median_ms']:.2f} | {ratio} | {to_floor} |"
        )
    return "\n".join(lines)


def run(args):
    quick = args.quick
    repeats = args.repeats or (2 if quick else 9)
    min_seconds = 0.01 if quick else 0.3
    big = 32 if quick else 224
    rows = []

    def record(task, model_name, side, batch, samples):
        for variant, ms in samples.items():
            row = {
                "task": task,
                "model": model_name,
                "variant": variant,
                "input": side,
                "batch": batch,
                "median_ms": float(statistics.median(ms)),
                "rounds_ms": [float(m) for m in ms],
            }
            if task == "openvino_infer":
                row["openvino_precision"] = export.OPENVINO_PRECISION
            rows.append(row)
            print(json.dumps(row), flush=True)

    for model_name, spec in model_specs(quick).items():
        if model_name.split("_")[0] not in args.models:
            continue
        if "train_step" in args.tasks:
            settings = [(32, 8)] if quick else [(32, 128), (224, 32)]
            for side, batch in settings:
                classes = 10 if side == 32 else 1000
                models = build_variants(model_name, spec, side, classes, TRAIN_VARIANTS, None)
                samples = measure(
                    train_functions(models, side, batch, classes), repeats, min_seconds
                )
                record("train_step", model_name, side, batch, samples)
        infer_tasks = [t for t in ("keras_infer", *RUNTIME_TASKS) if t in args.tasks]
        if not infer_tasks:
            continue
        variants = [v for v in args.variants if v in VARIANTS]
        torchvision = (
            load_torchvision(args.torchvision)
            if model_name == "v2_1.0" and (args.torchvision)
            else None
        )
        models = build_variants(
            model_name, spec, big, 1000, variants, args.balanced_time_limit, torchvision
        )
        if "keras_infer" in infer_tasks:
            for batch in (1, 4) if quick else (1, 64):
                functions = keras_functions(models, big, batch)
                if functions:  # none when only LiteRT-only variants are asked for
                    record(
                        "keras_infer",
                        model_name,
                        big,
                        batch,
                        measure(functions, repeats, min_seconds),
                    )
        runtimes = [t for t in RUNTIME_TASKS if t in infer_tasks]
        if runtimes:
            with tempfile.TemporaryDirectory() as directory:
                functions, sizes = runtime_functions(
                    runtimes, models, big, args.threads, directory, torchvision
                )
                clock = time.process_time if args.cpu_time else time.perf_counter
                samples = measure(functions, repeats * (1 if quick else 3), min_seconds, clock)
            named = {f"{task}/{variant}": size for (task, variant), size in sizes.items()}
            print(f"# {model_name}: file bytes {json.dumps(named)}", flush=True)
            for task in runtimes:
                record(
                    task, model_name, big, 1, {v: ms for (t, v), ms in samples.items() if t == task}
                )
        keras.backend.clear_session()
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny nets and inputs (tests)")
    parser.add_argument("--json", help="write the rows to this JSON file")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(DEFAULT_TASKS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--models", nargs="+", choices=("v1", "v2"), default=["v1", "v2"])
    parser.add_argument("--repeats", type=int, default=None, help="samples per median")
    parser.add_argument(
        "--threads", type=int, default=2, help="LiteRT, ONNX Runtime and OpenVINO threads"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the runtimes by the process's CPU time, not wall time: with --threads 1, "
        "what a machine loaded by other processes disturbs least",
    )
    parser.add_argument(
        "--torchvision",
        metavar="DIR",
        help="also time torchvision's v2 1.0x graph (experiments/torchvision_onnx.py's folder)",
    )
    parser.add_argument(
        "--balanced-time-limit",
        type=float,
        default=20.0,
        help="seconds per layer for balanced hardening's MIP (best permutation so far)",
    )
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1. Received: repeats={args.repeats}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1. Received: threads={args.threads}")
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(markdown(rows))
    print(runtime_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
