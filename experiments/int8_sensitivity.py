"""Per-layer sensitivity for LiteRT's int8 file (issue 53, item 2): TensorFlow's own
quantization debugger (`tf.lite.experimental.QuantizationDebugger`) runs each int8 op
beside its float op on the calibration images and gives each quantized tensor its error;
the `k` tensors of largest error relative to their own spread (RMSE / standard deviation
of the float tensor: the noise-to-signal ratio) are kept in float (`denylisted_nodes`: selective
quantization) and each file is checked on the test images against the float model, and
timed at batch 1 against the full-int8 file in the same process, rounds interleaved.

The files keep float inputs and outputs (as the default file does); a file with float
nodes holds quantize/dequantize pairs around them (not `TFLITE_BUILTINS_INT8` only). The
ranking uses the calibration images only, never the test images.

One row per seed and setting ("default": `export.int8`'s file; "k<k>": the debugger's
file with `k` tensors in float) goes to `--json` as it is measured; a rerun skips the
(seed, setting) pairs it holds. The net and the images are `experiments.int8_levers`'s.

Usage:
    python -m experiments.int8_sensitivity --model runs/fm_v2/model.keras \
        --json docs/results/int8_sensitivity.json --seeds 0 1 2 3 4 --ks 0 1 2 4 8
"""

import argparse
import csv
import io
import json
import os
import tempfile

import numpy as np

from experiments.int8_accuracy import _row
from experiments.int8_levers import study_net, summarize, table

BASE = "default"


def setting_name(k: int) -> str:
    return f"k{k}"


class Sensitivity:
    """The debugger of one net and one calibration set: its calibrated model (converted
    once) and the tensors ranked by error; `file(k, path)` writes the int8 file with the
    `k` most sensitive in float."""

    def __init__(self, folded, calibration: np.ndarray) -> None:
        import tensorflow as tf

        data = np.asarray(calibration, dtype="float32")

        def dataset():
            for i in range(len(data)):
                yield [data[i : i + 1]]

        with tempfile.TemporaryDirectory() as saved:
            folded.export(saved, format="tf_saved_model", verbose=False)
            converter = tf.lite.TFLiteConverter.from_saved_model(saved)
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = dataset
            self.debugger = tf.lite.experimental.QuantizationDebugger(
                converter=converter,
                debug_dataset=dataset,
                debug_options=tf.lite.experimental.QuantizationDebugOptions(
                    layer_direct_compare_metrics={"noise_to_signal": noise_to_signal}
                ),
            )
        self.debugger.run()
        self.ranked = ranked_tensors(self.debugger)

    def file(self, k: int, path: str) -> list[str]:
        """Writes the int8 file with the `k` most sensitive tensors' ops in float to
        `path`; returns their names."""
        import tensorflow as tf

        names = [name for name, _ in self.ranked[:k]]
        self.debugger.options = tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=names or None
        )
        with open(path, "wb") as f:
            f.write(self.debugger.get_nondebug_quantized_model())
        return names


def noise_to_signal(float_values, quantized, scale, zero_point) -> float:
    """RMSE of the dequantized int8 tensor against the float op's, over the float
    tensor's standard deviation (a debugger `layer_direct_compare_metrics` function)."""
    with np.errstate(all="ignore"):  # a tensor the debugger reads as garbage: NaN, skipped
        error = (quantized.astype("float64") - zero_point) * scale - float_values
        return float(np.sqrt(np.mean(error**2)) / (np.std(float_values) + 1e-12))


def ranked_tensors(debugger) -> list[tuple[str, float]]:
    """(tensor name, noise-to-signal ratio) of each quantized tensor the debugger
    measured, the largest first."""
    text = io.StringIO()
    debugger.layer_statistics_dump(text)
    scores = [
        (row["tensor_name"], float(row["noise_to_signal"]))
        for row in csv.DictReader(io.StringIO(text.getvalue()))
        if np.isfinite(float(row["noise_to_signal"]))
    ]
    return sorted(scores, key=lambda item: -item[1])


def interleaved_latency(paths: dict, input_shape, rounds: int, threads: int) -> dict:
    """{name: median ms at batch 1 over `rounds` rounds}; each round times every file once
    (`file_latency`'s median of its calls), in turn, so load on the machine falls on all."""
    from keras_autoshuffle.finetuning.metrics import file_latency

    times = {name: [] for name in paths}
    for _ in range(rounds):
        for name, path in paths.items():
            times[name].append(file_latency(path, input_shape, threads, 5, 30)["median_ms"])
    return {name: float(np.median(values)) for name, values in times.items()}


def measure(folded, float_path, calibration, test, float_outputs, ks, latency_rounds, threads):
    """The rows' entries of one net and calibration set: {setting: check entry, with
    `float_nodes` and `latency_ms`}; the latencies in one interleaved run, with the float
    file's."""
    from keras_autoshuffle.export import int8

    images, labels = test
    entries, paths = {}, {"float": float_path}
    folder = tempfile.mkdtemp(prefix="int8_sensitivity_")
    paths[BASE] = os.path.join(folder, "default.tflite")
    entries[BASE] = int8._export_int8_checked(
        folded, paths[BASE], float_path, calibration, images, labels, float_outputs, 100.0
    )
    sensitivity = Sensitivity(folded, calibration)
    for k in ks:
        name = setting_name(k)
        paths[name] = os.path.join(folder, f"{name}.tflite")
        kept = sensitivity.file(k, paths[name])
        entries[name] = int8.int8_check(paths[name], float_path, images, labels, float_outputs)
        entries[name]["float_nodes"] = kept
    if latency_rounds:
        shape = (1, *images.shape[1:])
        latency = interleaved_latency(paths, shape, latency_rounds, threads)
        for name, entry in entries.items():
            entry["latency_ms"] = latency[name]
            entry["float_latency_ms"] = latency["float"]
    return entries


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a hardened model.keras (Fashion-MNIST)")
    parser.add_argument("--json", required=True, help="rows file (appended to, per seed)")
    parser.add_argument("--table", action="store_true", help="print the summary, measure nothing")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--calibration", type=int, default=500)
    parser.add_argument("--test-images", type=int, default=10000)
    parser.add_argument("--latency-rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.table:
        with open(args.json) as f:
            print(table(summarize(json.load(f)["rows"], BASE), BASE))
        return 0
    if not args.model:
        parser.error("--model is required unless --table")
    if any(k < 0 for k in args.ks):
        parser.error(f"--ks must be non-negative integers. Received: --ks {args.ks}")

    from keras_autoshuffle import export
    from keras_autoshuffle._atomic import write_json
    from keras_autoshuffle.finetuning.report import cpu_name

    model, train, images, labels, folded = study_net(args.model, args.test_images)
    settings = {
        "model": os.path.abspath(args.model),
        "calibration_images": args.calibration,
        "test_images": len(labels),
        "latency": f"LiteRT, batch 1, {args.threads} thread(s), {args.latency_rounds} rounds",
        "cpu": cpu_name(),
    }
    rows = []
    if os.path.exists(args.json):
        with open(args.json) as f:
            rows = json.load(f)["rows"]
    done = {(r["seed"], r["setting"]) for r in rows}
    scratch = tempfile.mkdtemp(prefix="int8_sensitivity_float_")
    export.export_model(folded, scratch, images[:8], formats=("litert",), reference=model)
    float_path = os.path.join(scratch, "model.tflite")
    float_outputs = model.predict(images, batch_size=256, verbose=0)
    for seed in args.seeds:
        if all((seed, s) in done for s in [BASE, *map(setting_name, args.ks)]):
            continue
        pick = np.random.default_rng(seed).choice(len(train.images), args.calibration, False)
        calibration = train.images[np.sort(pick)]
        entries = measure(
            folded,
            float_path,
            calibration,
            (images, labels),
            float_outputs,
            args.ks,
            args.latency_rounds,
            args.threads,
        )
        for setting, entry in entries.items():
            extra = {
                k: entry[k] for k in ("float_nodes", "latency_ms", "float_latency_ms") if k in entry
            }
            rows.append({**_row(seed, "litert", entry), "setting": setting, **extra})
            print(json.dumps(rows[-1]), flush=True)
        write_json(
            args.json, {"settings": settings, "rows": rows, "summary": summarize(rows, BASE)}
        )
    print(table(summarize(rows, BASE), BASE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
