"""Equal channel ranges before int8, measured against the files without it (issue 53,
item 2; a lever measured and not adopted: docs/lab-notes/inference.md, "Equal channel
ranges before int8").

An int8 file quantizes each weight per output channel but each activation per tensor, one
scale set by the tensor's largest channel. Where a BatchNormalization's output reaches a
convolution only through a ReLU and zero padding (which commute with a positive
per-channel scale), the BatchNormalization can divide channel `c` by `s_c` and the
convolution multiply its input channel `c` by `s_c` without changing the float function.
`equalize_ranges` takes `s_c` = the channel's range on the calibration images over the
tensor's largest (Nagel et al., "Data-Free Quantization Through Weight Equalization and
Bias Correction", ICCV 2019, Sec. 4.1, with measured ranges as SmoothQuant's at migration
strength 1). In a ShuffleNet v2 branch: the ReLU's output before the depthwise conv and the
depthwise output before the second 1x1 conv.

The comparison: each runtime's int8 file of the folded net ("default") and of its
equalized copy ("equalized"), quantized by the package's writers, checked on the same test
images against the same float Keras model, paired by net and calibration; besides top-1
agreement and the accuracy drop, the int8 outputs' RMS error relative to the float
outputs' RMS (finer than agreement on a few hundred images). Not in CI.

Nets:
- `transfer`: the fine-tuned nets of an `experiments.transfer_study` results folder, each
  with finetune's own calibration and validation images (`int8_transfer_levers.net_data`;
  LiteRT as finetune writes it, taking RGB in [0, 1] when the mediapipe extra is here);
- `digits`: `autoshuffle-train --dataset digits` run folders, calibrated on 500 training
  images drawn with each `--seeds` seed, tested on the 360 test images.

One row per (net, calibration seed, runtime, setting) appended to `--rows` as measured; a
rerun skips the (net, seed) pairs it holds.

Usage (the rows of the lab notes):
    python -m experiments.transfer_study --results runs/transfer_regen --work runs/transfer_int8 \
        --only backbone transfer --per-class 20 100 --epochs 17 7 --int8-per-class 20 100 \
        --no-end-to-end   # docs/results/transfer_int8's plan, trained again
    python -m experiments.int8_equalize transfer --results runs/transfer_regen \
        --work runs/transfer_int8 --rows docs/results/int8_equalize_transfer.jsonl
    for s in 0 1 2 3 4; do autoshuffle-train --dataset digits --epochs 10 --seed $s \
        --output runs/digits_s$s; done
    python -m experiments.int8_equalize digits --runs runs/digits_s0 ... runs/digits_s4 \
        --seeds 0 1 2 --rows docs/results/int8_equalize_digits.jsonl
    python -m experiments.int8_equalize table --rows docs/results/int8_equalize_digits.jsonl
"""

import argparse
import json
import os
import tempfile

import keras
import numpy as np

from experiments import int8_levers, int8_transfer_levers
from experiments.int8_accuracy import _interval, _row
from experiments.scale_study import append_row
from keras_autoshuffle._files import sha256_of
from keras_autoshuffle._keras_internals import inbound_nodes, producing_layer

SETTINGS = ("default", "equalized")
RUNTIMES = ("litert", "onnx", "openvino")

# Channels whose range is below this fraction of the tensor's largest are left as they
# are (a channel dead on the calibration images would otherwise be scaled without bound).
_MIN_RELATIVE_RANGE = 1e-3
_BATCH = 64


def equalize_ranges(model: keras.Model, images: np.ndarray) -> keras.Model:
    """A copy of `model` computing the same function (within float rounding), in which
    each tensor between a BatchNormalization and the convolution that alone reads it has
    equal per-channel ranges (max |x|) on `images`.

    Matched: BatchNormalization (with its scale and offset), then optionally ReLU (no
    `max_value`, threshold 0) and ZeroPadding2D, read only by a Conv2D of one group or a
    DepthwiseConv2D of depth multiplier 1. Nested functional models (a folded net behind
    an input normalization) are equalized on the inputs they receive. `model` is not
    changed; a Sequential model, or one holding a Lambda layer, is returned as it is.

    Args:
        model: a single-input functional Keras model, e.g. a folded ShuffleNet.
        images: float32 inputs to measure the ranges on (the int8 calibration images).

    Returns:
        The equalized copy.
    """
    # A Sequential model has no `operations` graph to walk, and a Lambda's Python function
    # is not copied from its config (Keras's safe mode): such a model is returned as it is.
    if not _walkable(model) or len(model.inputs) != 1:
        return model
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    _equalize(copy, np.asarray(images, dtype="float32"))
    return copy


def _walkable(model):
    return hasattr(model, "operations") and all(
        _walkable(op) if isinstance(op, keras.Model) else not isinstance(op, keras.layers.Lambda)
        for op in model.operations
    )


def _equalize(model, images):
    for op in model.operations:  # nested models first, on what reaches them
        if isinstance(op, keras.Model):
            (inner,) = _channel_values(model, [inbound_nodes(op)[0].input_tensors[0]], images, None)
            _equalize(op, inner)
    chains = _chains(model)
    if not chains:
        return
    taps = [inbound_nodes(consumer)[0].input_tensors[0] for _, consumer in chains]
    ranges_per_chain = _channel_values(model, taps, images, (1, 2))
    for (norm, consumer), ranges in zip(chains, ranges_per_chain, strict=True):
        largest = float(np.max(ranges))
        live = ranges > _MIN_RELATIVE_RANGE * largest
        if largest <= 0 or not np.all(np.isfinite(ranges)):
            continue
        scale = np.where(live, ranges / largest, 1.0).astype("float32")
        gamma, beta = norm.gamma, norm.beta
        gamma.assign(gamma.numpy() / scale)
        beta.assign(beta.numpy() / scale)
        kernel = consumer.kernel  # (h, w, input channels, outputs or depth multiplier)
        kernel.assign(kernel.numpy() * scale[None, None, :, None])


def _readers(model):
    readers = {}
    for op in model.operations:
        for node in inbound_nodes(op):
            for tensor in node.input_tensors:
                readers.setdefault(id(producing_layer(tensor)), []).append(op)
    return readers


def _chains(model):
    """[(BatchNormalization, the convolution that alone reads it)] in `model`'s own graph."""
    readers = _readers(model)
    chains = []
    for norm in model.operations:
        if not (isinstance(norm, keras.layers.BatchNormalization) and norm.scale and norm.center):
            continue
        if len(inbound_nodes(norm)) != 1:
            continue
        op = norm
        while True:
            after = readers.get(id(op), [])
            if len(after) != 1 or len(inbound_nodes(after[0])) != 1:
                break
            op = after[0]
            if not _commutes(op):
                break
        if _scalable_input(op):
            chains.append((norm, op))
    return chains


def _commutes(op):
    """Whether `op` commutes with a positive per-channel scale."""
    if isinstance(op, keras.layers.ZeroPadding2D):
        return True
    return isinstance(op, keras.layers.ReLU) and op.max_value is None and float(op.threshold) == 0.0


def _scalable_input(op):
    """Whether `op`'s kernel can take a per-input-channel scale (its axis 2)."""
    if isinstance(op, keras.layers.DepthwiseConv2D):
        return op.depth_multiplier == 1 and op.data_format == "channels_last"
    return (
        isinstance(op, keras.layers.Conv2D) and op.groups == 1 and op.data_format == "channels_last"
    )


def _channel_values(model, tensors, images, axes):
    """Each of `tensors` on `images` (`axes` None), or its max |x| per channel over the
    images and `axes`."""
    probe = keras.Model(
        model.inputs[0],
        [t if axes is None else keras.ops.max(keras.ops.abs(t), axis=axes) for t in tensors],
    )
    parts = [[] for _ in tensors]
    for start in range(0, len(images), _BATCH):
        outputs = probe(images[start : start + _BATCH], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        for part, output in zip(parts, outputs, strict=True):
            part.append(keras.ops.convert_to_numpy(output))
    values = [np.concatenate(part) for part in parts]
    return values if axes is None else [np.max(v, axis=0) for v in values]


def relative_error(outputs: np.ndarray, expected: np.ndarray) -> float:
    """RMS of `outputs - expected` over the RMS of `expected`."""
    difference = np.asarray(outputs, "float64") - np.asarray(expected, "float64")
    return float(np.sqrt(np.mean(difference**2) / np.mean(np.asarray(expected, "float64") ** 2)))


def measure_files(net, lite, calibration, test, float_outputs):
    """{runtime: check entry with "relative_error" and "outputs" (the int8 file's outputs on
    the test images)} of `net`'s three int8 files: LiteRT from `lite` = (its net,
    calibration, test images) as the caller's export writes it, ONNX Runtime and OpenVINO
    from `net`'s float files (`int8_levers.Files`) at the defaults."""
    from keras_autoshuffle import export
    from keras_autoshuffle.export import int8, int8_runtimes
    from keras_autoshuffle.export.runner import open_runner

    images, labels = test
    files = int8_levers.Files(net, net, images)
    entries = {}
    with tempfile.TemporaryDirectory() as folder:
        lite_net, lite_calibration, lite_images = lite
        lite_float = os.path.join(folder, "float")
        export.export_model(lite_net, lite_float, lite_images[:8], formats=("litert",))
        entries["litert"] = (
            int8._export_int8_checked(
                lite_net,
                os.path.join(folder, "int8.tflite"),
                os.path.join(lite_float, "model.tflite"),
                lite_calibration,
                lite_images,
                labels,
                float_outputs,
                100.0,
            ),
            lite_images,
        )
        for runtime in ("onnx", "openvino"):
            entries[runtime] = (
                int8_runtimes.export_int8_file_checked(
                    f"{runtime}_int8",
                    files.paths[runtime],
                    os.path.join(folder, "int8.onnx" if runtime == "onnx" else "openvino_int8"),
                    calibration,
                    test,
                    float_outputs,
                    100.0,
                ),
                images,
            )
        measured = {}
        for runtime, (entry, inputs) in entries.items():
            outputs = open_runner(entry["path"]).run(inputs)
            measured[runtime] = {
                **entry,
                "relative_error": relative_error(outputs, float_outputs),
                "outputs": outputs,
            }
        return measured


def measure_net(name, seed, model, folded, calibration, test, lite_inputs, write):
    """Both settings of one net and calibration; each row given to `write`."""
    float_outputs = model.predict(test[0], batch_size=256, verbose=0)
    for setting in SETTINGS:
        net = folded if setting == "default" else equalize_ranges(folded, calibration)
        lite = lite_inputs(net)
        for runtime, entry in measure_files(net, lite, calibration, test, float_outputs).items():
            write(
                {
                    **_row(f"{name}/{seed}", runtime, entry),
                    "net": name,
                    "calibration_seed": seed,
                    "setting": setting,
                    "relative_error": entry["relative_error"],
                    "test_images": len(test[1]),
                    "calibration_images": len(calibration),
                }
            )


def transfer_nets(results, work):
    """(name, seed, model, folded, calibration, test, lite_inputs, extra) per finished
    transfer run of the study in `results`."""
    from experiments.transfer_study import PLAN_FILE, ROWS_FILE, read_rows
    from keras_autoshuffle import folding
    from keras_autoshuffle.finetuning.run import _unit_rgb
    from keras_autoshuffle.finetuning.run_folder import ALL_DIR

    with open(os.path.join(results, PLAN_FILE)) as f:
        plan = json.load(f)
    for row in read_rows(os.path.join(results, ROWS_FILE), plan["plan"]):
        if row["arm"] != "transfer":
            continue
        folder = os.path.join(work, "runs", row["name"])
        root = os.path.join(work, "folders", f"target_{row['per_class']}_seed{row['seed']}")
        model, calibration, test = int8_transfer_levers.net_data(folder, plan["settings"], root)
        folded = folding.fold_model(model, name=model.name)

        def lite_inputs(net, model=model, calibration=calibration, test=test):
            from keras_autoshuffle import export
            from keras_autoshuffle.export import metadata

            if not export.is_installed("mediapipe"):
                return net, calibration, test[0]
            return (
                metadata.with_input_normalization(net),
                _unit_rgb(calibration),
                _unit_rgb(test[0]),
            )

        extra = {
            "per_class": row["per_class"],
            "study_seed": row["seed"],
            "model_sha256": sha256_of(os.path.join(folder, ALL_DIR, "model.keras")),
        }
        yield row["name"], 0, model, folded, calibration, test, lite_inputs, extra


def digits_nets(runs, seeds):
    """The same for `autoshuffle-train --dataset digits` run folders, per calibration seed."""
    import keras

    from keras_autoshuffle import folding
    from keras_autoshuffle.data import sources

    (train, _), (images, labels) = sources.load_digits()
    train, images = (train - 0.5) / 0.5, (images - 0.5) / 0.5  # `sources.digits`
    for run in runs:
        path = os.path.join(run, "model.keras")
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
        folded = folding.fold_model(model, name=model.name)
        extra = {"model_sha256": sha256_of(path)}
        for seed in seeds:
            pick = np.random.default_rng(seed).choice(len(train), 500, replace=False)
            calibration = train[pick]
            yield (
                os.path.basename(os.path.normpath(run)),
                seed,
                model,
                folded,
                calibration,
                (images, labels.astype("int64")),
                lambda net, c=calibration: (net, c, images),
                extra,
            )


def summarize(rows):
    """`int8_levers.summarize` (agreement, drop) with the relative error's mean and its
    paired change, per runtime and setting."""
    summary = int8_levers.summarize(rows, "default")
    base = {(r["seed"], r["runtime"]): r for r in rows if r["setting"] == "default"}
    for runtime, settings in summary.items():
        for setting, s in settings.items():
            picked = [r for r in rows if r["runtime"] == runtime and r["setting"] == setting]
            s["relative_error"] = _interval([r["relative_error"] for r in picked])
            s["minus_base"]["relative_error"] = _interval(
                [r["relative_error"] - base[r["seed"], runtime]["relative_error"] for r in picked]
            )
    return summary


def table(summary):
    """`int8_levers.table` and a table of the relative error."""
    lines = [
        int8_levers.table(summary, "default"),
        "",
        "| runtime | setting | pairs | relative RMS error of the int8 outputs (%) | change |",
        "|---|---|---|---|---|",
    ]
    for runtime, settings in summary.items():
        for setting, s in settings.items():
            change = s["minus_base"]["relative_error"]
            lines.append(
                f"| {runtime} | {setting} | {s['seeds']} | "
                f"{int8_levers._points(s['relative_error'])} | "
                + ("" if setting == "default" else int8_levers._points(change, sign=True))
                + " |"
            )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nets", choices=("transfer", "digits", "table"))
    parser.add_argument("--rows", required=True, help="JSON lines, appended as measured")
    parser.add_argument("--results", help="transfer: the study's results folder")
    parser.add_argument("--work", help="transfer: its --work folder")
    parser.add_argument("--runs", nargs="+", help="digits: autoshuffle-train run folders")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    if args.nets == "transfer" and not (args.results and args.work):
        parser.error("transfer needs --results and --work")
    if args.nets == "digits" and not args.runs:
        parser.error("digits needs --runs")
    if args.nets != "table":
        held = int8_transfer_levers.read_levers(args.rows)
        done = {(r["net"], r["calibration_seed"]) for r in held}
        nets = (
            transfer_nets(args.results, args.work)
            if args.nets == "transfer"
            else digits_nets(args.runs, args.seeds)
        )
        for name, seed, model, folded, calibration, test, lite_inputs, extra in nets:
            if (name, seed) in done:
                continue

            def write(row, extra=extra):
                append_row(args.rows, {**row, **extra})
                print(json.dumps(row), flush=True)

            measure_net(name, seed, model, folded, calibration, test, lite_inputs, write)
    print(table(summarize(int8_transfer_levers.read_levers(args.rows))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
