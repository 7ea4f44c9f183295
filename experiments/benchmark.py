"""Side-by-side speed of manual, relaxed, hardened and folded shuffles.

In one process, interleaved and repeated (warm-up, then the median of `--repeats`
samples, the variants' order rotated every round), for ShuffleNet v1 g3 1.0x and v2 1.0x:

- train_step: a `train_on_batch` step, manual vs relaxed, at 32x32 batch 128 (CIFAR
  stem) and 224x224 batch 32;
- keras_infer: a traced `model(x, training=False)` (tf.function) at 224x224, batch 1
  and 64;
- litert_infer: the LiteRT interpreter (XNNPACK) at 224x224, batch 1, `--threads` 2.

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
        [--models v2] [--variants manual hardened_folded]
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_autoshuffle import ChannelShuffle, export, folding, harden_model  # noqa: E402
from keras_autoshuffle.applications import ShuffleNetV1, ShuffleNetV2  # noqa: E402

TASKS = ("train_step", "keras_infer", "litert_infer")
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
            "v1_g3_0.25": (ShuffleNetV1, {"groups": 3, "width": 0.25}),
            "v2_0.5": (ShuffleNetV2, {"width": 0.5}),
        }
    return {
        "v1_g3_1.0": (ShuffleNetV1, {"groups": 3, "width": 1.0}),
        "v2_1.0": (ShuffleNetV2, {"width": 1.0}),
    }


def _no_shuffle(model):
    """The same net with `Identity` in place of each ChannelShuffle."""

    def clone(layer):
        if isinstance(layer, ChannelShuffle):
            return keras.layers.Identity(name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(model, clone_function=clone)


def build_variants(name, spec, side, classes, variants, time_limit):
    """{variant: model} for one net at `side` x `side` input."""
    builder, kwargs = spec
    common = {**kwargs, "input_shape": (side, side, 3), "classes": classes}
    models = {}
    manual = builder(shuffle="manual", **common)
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
    models.pop("hardened", None)
    return models


def measure(functions, repeats, min_seconds):
    """Median milliseconds per call of each function, interleaved and repeated."""
    numbers = {}
    for name, fn in functions.items():
        fn()  # warm-up (tracing, allocation)
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-6)
        numbers[name] = max(1, math.ceil(min_seconds / once))
    samples = {name: [] for name in functions}
    names = list(functions)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            fn, number = functions[name], numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - start) / number)
    return {name: 1000 * statistics.median(values) for name, values in samples.items()}


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


def litert_functions(models, side, threads, directory):
    """({variant: timed call}, {variant: file bytes}) of each model's LiteRT file."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, side, side, 3)).astype("float32")
    calibration = rng.normal(size=(8, side, side, 3)).astype("float32")
    functions, sizes = {}, {}
    for variant, model in models.items():
        path = os.path.join(directory, f"{model.name}_{variant}.tflite")
        if variant in INT8_VARIANTS:
            export.export_int8(model, path, calibration)
        else:
            export.export_litert(model, path)
        sizes[variant] = os.path.getsize(path)
        interpreter = export.litert_interpreter(path, 1, threads)
        functions[variant] = lambda i=interpreter: export.litert_run(i, x)
    return functions, sizes


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

    def record(task, model_name, side, batch, medians):
        for variant, ms in medians.items():
            row = {
                "task": task,
                "model": model_name,
                "variant": variant,
                "input": side,
                "batch": batch,
                "median_ms": float(ms),
            }
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
                medians = measure(
                    train_functions(models, side, batch, classes), repeats, min_seconds
                )
                record("train_step", model_name, side, batch, medians)
        infer_tasks = [t for t in ("keras_infer", "litert_infer") if t in args.tasks]
        if not infer_tasks:
            continue
        variants = [v for v in args.variants if v in VARIANTS]
        models = build_variants(model_name, spec, big, 1000, variants, args.balanced_time_limit)
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
        if "litert_infer" in infer_tasks:
            with tempfile.TemporaryDirectory() as directory:
                functions, sizes = litert_functions(models, big, args.threads, directory)
                medians = measure(functions, repeats * (1 if quick else 3), min_seconds)
            print(f"# {model_name}: LiteRT file bytes {json.dumps(sizes)}", flush=True)
            record("litert_infer", model_name, big, 1, medians)
        keras.backend.clear_session()
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny nets and inputs (tests)")
    parser.add_argument("--json", help="write the rows to this JSON file")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--models", nargs="+", choices=("v1", "v2"), default=["v1", "v2"])
    parser.add_argument("--repeats", type=int, default=None, help="samples per median")
    parser.add_argument("--threads", type=int, default=2, help="LiteRT threads")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
