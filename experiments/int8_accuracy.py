"""int8 against float on real images: each runtime's int8 file of one trained net, over
several calibration seeds (issue 42, item 4). Not in CI.

The net: a `model.keras` written by `autoshuffle-train` on Fashion-MNIST (real photos of
clothes nobody here made; Debian's `dataset-fashion-mnist`). For each seed, `--calibration`
training images drawn at random with that seed calibrate `export.export_model(folded,
formats=("litert", "onnx", "openvino"), quantize="int8")`, whose checks run on all 10,000
test images against the hardened Keras model; the limits are opened so that every file is
kept and measured (the numbers decide, not the default 0.99 / 0.5). One row per seed and
runtime goes to `--json` as it is measured (a stopped run keeps its rows; a rerun skips
the seeds it holds).

`--first-layer-float` measures instead the ONNX and OpenVINO int8 files with the first
convolution left in float (`float_nodes` of `export_onnx_int8` / `export_openvino_int8`),
the same calibration images per seed as the full-integer rows of `--paired-with`, and
summarizes the paired differences (agreement and drop, this variant minus full int8).

Usage:
    autoshuffle-train --dataset fashion_mnist --model v2 --width 0.5 --epochs 5 \
        --seed 0 --output runs/fm_v2 --no-export
    python -m experiments.int8_accuracy --model runs/fm_v2/model.keras \
        --json docs/results/int8_accuracy.json --seeds 0 1 2 3 4
    python -m experiments.int8_accuracy --model runs/fm_v2/model.keras --first-layer-float \
        --json docs/results/int8_first_layer_float.json \
        --paired-with docs/results/int8_accuracy.json --seeds 0 1 2 3 4
"""

import argparse
import json
import os
import tempfile

import numpy as np

# {int8 result key: runtime}
RUNTIMES = {"int8": "litert", "onnx_int8": "onnx", "openvino_int8": "openvino"}


def _rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["rows"]


def _row(seed, runtime, entry):
    """One row from an int8 check's entry (`export_model`'s or `export_int8_file_checked`'s)."""
    return {
        "seed": seed,
        "runtime": runtime,
        "accuracy": entry["accuracy"],
        "float_accuracy": entry["float_accuracy"],
        "accuracy_drop": 100 * (entry["float_accuracy"] - entry["accuracy"]),
        "top1_agreement": entry["top1_agreement"],
        "bytes": entry["bytes"],
        "float_bytes": entry["float_bytes"],
    }


def _settings(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["settings"]


def check_settings(settings, json_path, paired_with):
    """Refuses rows of other settings: `json_path`'s (its seeds would be skipped as done)
    and `paired_with`'s (paired by seed, they must share the net and the images)."""
    held = _settings(json_path)
    if held is not None and held != settings:
        raise SystemExit(
            f"{json_path} holds rows of other settings: {held}. Write to another file. "
            f"Received: {settings}"
        )
    if paired_with:
        base = _settings(paired_with)
        if base is None:
            raise SystemExit(f"--paired-with: no such rows file. Received: {paired_with!r}")
        keys = ("model", "calibration_images", "test_images")
        if any(base.get(k) != settings[k] for k in keys):
            raise SystemExit(
                f"{paired_with} was measured with other settings: "
                f"{ {k: base.get(k) for k in keys} }. Received: { {k: settings[k] for k in keys} }"
            )


def _save(path, rows, settings, paired_with=None):
    from keras_autoshuffle._atomic import write_json

    content = {"settings": settings, "rows": rows, "summary": summarize(rows)}
    if paired_with is not None:
        content["paired_with"] = paired_with
        content["paired_differences"] = paired_differences(rows, _rows(paired_with))
    write_json(path, content)


def _interval(values):
    """Mean and 95% t interval of `values`."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return {"mean": mean, "ci95": [float("nan"), float("nan")]}
    half = float(stats.t.ppf(0.975, len(values) - 1) * stats.sem(values))
    return {"mean": mean, "ci95": [mean - half, mean + half]}


def paired_differences(rows, base_rows):
    """Per runtime: this variant minus the full int8 rows of the same seed, agreement (as a
    fraction) and accuracy drop (points), mean and 95% t interval over the shared seeds."""
    base = {(r["seed"], r["runtime"]): r for r in base_rows}
    result = {}
    for runtime in RUNTIMES.values():
        pairs = [
            (r, base[r["seed"], runtime])
            for r in rows
            if r["runtime"] == runtime and (r["seed"], runtime) in base
        ]
        if not pairs:
            continue
        result[runtime] = {
            "seeds": len(pairs),
            **{
                name: _interval([r[name] - b[name] for r, b in pairs])
                for name in ("top1_agreement", "accuracy_drop")
            },
        }
    return result


def summarize(rows):
    """Per runtime: mean accuracy drop (points) and top-1 agreement over the seeds, with
    95% t intervals."""
    summary = {}
    for runtime in RUNTIMES.values():
        picked = [r for r in rows if r["runtime"] == runtime]
        if not picked:
            continue
        summary[runtime] = {
            "seeds": len(picked),
            **{
                name: _interval([r[name] for r in picked])
                for name in ("accuracy_drop", "top1_agreement")
            },
        }
    return summary


class FirstLayerFloat:
    """The ONNX and OpenVINO int8 files with the net's first convolution left in float
    (named in each graph: its first Conv / Convolution), checked as `export_model` checks
    the full-integer ones: agreement with the Keras model, accuracy on the test images."""

    def __init__(self, folded, model, images, labels):
        import onnx
        import openvino

        from keras_autoshuffle import export
        from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

        self._scratch = tempfile.TemporaryDirectory()
        self.folder = self._scratch.name
        export.export_model(
            folded, self.folder, images[:8], formats=("onnx", "openvino"), reference=model
        )
        self.images, self.labels = images, labels
        self.float_outputs = model.predict(images, batch_size=256, verbose=0)
        graph = onnx.load(os.path.join(self.folder, "model.onnx")).graph
        self.onnx_first = next(n.name for n in graph.node if n.op_type == "Conv")
        ir = openvino.Core().read_model(os.path.join(self.folder, "openvino", OPENVINO_XML))
        self.openvino_first = next(
            op.get_friendly_name()
            for op in ir.get_ordered_ops()
            if op.get_type_name() == "Convolution"
        )

    def rows(self, seed, calibration):
        from keras_autoshuffle.export.int8_runtimes import export_int8_file_checked

        rows = []
        for runtime, name, first in (
            ("onnx", "model.onnx", self.onnx_first),
            ("openvino", "openvino", self.openvino_first),
        ):
            # The check export_model runs on the full-integer files, its limits opened.
            entry = export_int8_file_checked(
                f"{runtime}_int8",
                os.path.join(self.folder, name),
                # A suffix `open_runner` reads; OpenVINO's file is a folder.
                os.path.join(
                    self.folder, f"{runtime}_int8_{seed}{'.onnx' if runtime == 'onnx' else ''}"
                ),
                calibration,
                (self.images, self.labels),
                self.float_outputs,
                100.0,  # never refused: every file is measured
                float_nodes=[first],
            )
            rows.append({**_row(seed, runtime, entry), "float_node": first})
        return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a hardened model.keras")
    parser.add_argument("--json", required=True, help="rows file (appended to, per seed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--calibration", type=int, default=500)
    parser.add_argument(
        "--first-layer-float",
        action="store_true",
        help="ONNX and OpenVINO int8 with the first convolution in float",
    )
    parser.add_argument("--paired-with", help="the full-integer rows to pair by seed")
    args = parser.parse_args(argv)
    if args.first_layer_float != bool(args.paired_with):
        parser.error("--first-layer-float and --paired-with (the full-integer rows) go together.")

    import keras

    from keras_autoshuffle import data, export, folding
    from keras_autoshuffle.finetuning.report import cpu_name

    model = keras.saving.load_model(args.model, safe_mode=True)
    train, test = data.fashion_mnist(seed=0, augment=False)
    images, labels, train_images = test.images, test.labels, train.images
    folded = folding.fold_model(model, name=model.name)
    settings = {
        "model": os.path.abspath(args.model),
        "calibration_images": args.calibration,
        "test_images": len(labels),
        "cpu": cpu_name(),
        **({"variant": "first convolution in float"} if args.first_layer_float else {}),
    }
    check_settings(settings, args.json, args.paired_with)
    rows = _rows(args.json)
    done = {r["seed"] for r in rows}
    if args.first_layer_float:
        variant = FirstLayerFloat(folded, model, images, labels)
    for seed in args.seeds:
        if seed in done:
            continue
        pick = np.random.default_rng(seed).choice(len(train_images), args.calibration, False)
        if args.first_layer_float:
            rows += variant.rows(seed, train_images[np.sort(pick)])
            _save(args.json, rows, settings, args.paired_with)
            print(json.dumps(rows[-2:]), flush=True)
            continue
        with tempfile.TemporaryDirectory() as folder:
            results = export.export_model(
                folded,
                folder,
                images[:8],
                formats=("litert", "onnx", "openvino"),
                reference=model,
                quantize="int8",
                representative_data=train_images[np.sort(pick)],
                test_data=(images, labels),
                max_accuracy_drop=100.0,
            )
        for key, runtime in RUNTIMES.items():
            entry = results[key]
            rows.append(_row(seed, runtime, entry))
        _save(args.json, rows, settings)
        print(json.dumps(rows[-3:]), flush=True)
    print(json.dumps(summarize(rows), indent=1))
    if args.paired_with:
        print(json.dumps(paired_differences(rows, _rows(args.paired_with)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
