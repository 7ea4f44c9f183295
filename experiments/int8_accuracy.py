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

Usage:
    autoshuffle-train --dataset fashion_mnist --model v2 --width 0.5 --epochs 5 \
        --seed 0 --output /tmp/fm_v2 --no-export
    python -m experiments.int8_accuracy --model /tmp/fm_v2/model.keras \
        --json docs/results/int8_accuracy.json --seeds 0 1 2 3 4
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


def _save(path, rows, settings):
    from keras_autoshuffle._atomic import write_json

    write_json(path, {"settings": settings, "rows": rows, "summary": summarize(rows)})


def summarize(rows):
    """Per runtime: mean accuracy drop (points) and top-1 agreement over the seeds, with
    95% t intervals."""
    from scipy import stats

    summary = {}
    for runtime in RUNTIMES.values():
        picked = [r for r in rows if r["runtime"] == runtime]
        if not picked:
            continue
        entry = {"seeds": len(picked)}
        for name in ("accuracy_drop", "top1_agreement"):
            values = np.array([r[name] for r in picked], dtype=float)
            mean = float(values.mean())
            if len(values) > 1:
                half = float(stats.t.ppf(0.975, len(values) - 1) * stats.sem(values))
            else:
                half = float("nan")
            entry[name] = {"mean": mean, "ci95": [mean - half, mean + half]}
        summary[runtime] = entry
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a hardened model.keras")
    parser.add_argument("--json", required=True, help="rows file (appended to, per seed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--calibration", type=int, default=500)
    args = parser.parse_args(argv)

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
    }
    rows = _rows(args.json)
    done = {r["seed"] for r in rows}
    for seed in args.seeds:
        if seed in done:
            continue
        pick = np.random.default_rng(seed).choice(len(train_images), args.calibration, False)
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
                min_top1_agreement=0.0,
                max_accuracy_drop=100.0,
            )
        for key, runtime in RUNTIMES.items():
            entry = results[key]
            rows.append(
                {
                    "seed": seed,
                    "runtime": runtime,
                    "accuracy": entry["accuracy"],
                    "float_accuracy": entry["float_accuracy"],
                    "accuracy_drop": 100 * (entry["float_accuracy"] - entry["accuracy"]),
                    "top1_agreement": entry["top1_agreement"],
                    "bytes": entry["bytes"],
                    "float_bytes": entry["float_bytes"],
                }
            )
        _save(args.json, rows, settings)
        print(json.dumps(rows[-3:]), flush=True)
    print(json.dumps(summarize(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
