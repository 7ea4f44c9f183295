"""OpenVINO int8 files with NNCF's default activation ranges against min/max ranges
(issue 53, item 2): each trained net's files from the same calibration images, checked on
the test images against the float model, paired by net and seed. Not in CI.

NNCF's default range for a per-tensor activation is MEAN_MINMAX: the mean over the
calibration batches of each batch's min and max. The package fed it one image a batch, so
an activation's range was the mean image's, and every image beyond it was clipped. Since
this change `export_openvino_int8`'s "minmax" is NNCF's MINMAX (the range over all the
images, as ONNX Runtime's and LiteRT's). Arms per seed: "openvino_mean_minmax" (the earlier
file: the same `nncf.quantize` call without the range setting), "openvino" (today's), and
for reference "onnx" and "litert", today's files from the same images.

Rows (JSON lines, one per net, seed and arm) go to `--rows` as they are measured; a rerun
skips what it holds. `--table` prints the summary: each arm's agreement and drop, mean and
95% t interval, and "openvino" - "openvino_mean_minmax" paired by net and seed.

Usage:
    python -m experiments.openvino_ranges --dataset digits \
        --models runs/ovr/digits_s*/model.keras --seeds 0 --rows ROWS.jsonl
    python -m experiments.openvino_ranges --dataset fashion_mnist \
        --models runs/ovr/fm_v2/model.keras --seeds 0 1 2 3 4 --rows ROWS.jsonl
    python -m experiments.openvino_ranges --rows ROWS.jsonl --table
"""

import argparse
import contextlib
import io
import json
import os
import tempfile

import numpy as np

from experiments.int8_accuracy import _interval, _row
from experiments.int8_levers import Files, measure

BEFORE, AFTER = "openvino_mean_minmax", "openvino"


def before_file(float_folder: str, folder: str, calibration: np.ndarray) -> str:
    """The OpenVINO int8 IR the package wrote before this change: `nncf.quantize` with
    7-bit weights and NNCF's default activation ranges, one image a batch."""
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

    model = openvino.Core().read_model(os.path.join(float_folder, OPENVINO_XML))
    dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
    advanced = AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE)
    with contextlib.redirect_stdout(io.StringIO()):
        quantized = nncf.quantize(
            model, dataset, subset_size=len(calibration), advanced_parameters=advanced
        )
    os.makedirs(folder)
    openvino.save_model(quantized, os.path.join(folder, OPENVINO_XML), compress_to_fp16=False)
    return folder


def study(path, dataset, seeds, calibration_size, rows_path):
    import keras

    from keras_autoshuffle import data, folding
    from keras_autoshuffle.export import int8

    held = _read(rows_path)
    done = {(r["model"], r["seed"], r["setting"]) for r in held}
    model = keras.saving.load_model(path, safe_mode=True)
    train, test = getattr(data, dataset)(seed=0, augment=False)
    folded = folding.fold_model(model, name=model.name)
    files = Files(folded, model, test.images)
    float_outputs = model.predict(test.images, batch_size=256, verbose=0)
    for seed in seeds:
        pick = np.random.default_rng(seed).choice(len(train.images), calibration_size, False)
        calibration = train.images[np.sort(pick)]
        for setting in ("litert", "onnx", AFTER, BEFORE):
            if (path, seed, setting) in done:
                continue
            if setting == BEFORE:
                with tempfile.TemporaryDirectory() as scratch:
                    folder = before_file(files.paths["openvino"], f"{scratch}/ir", calibration)
                    entry = int8.int8_check(
                        folder, files.paths["openvino"], test.images, test.labels, float_outputs
                    )
            else:
                entry = measure(
                    setting, "7bit", files, folded, calibration, (test.images, test.labels),
                    float_outputs,
                )  # fmt: skip
            row = {**_row(seed, setting, entry), "setting": setting, "model": path}
            row.update(dataset=dataset, test_images=len(test.labels), calibration=calibration_size)
            with open(rows_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(rows) -> dict:
    """{data set: {setting: {"n", "agreement" (%), "drop" (points): mean and 95% t
    interval, and for AFTER "change": AFTER - BEFORE paired by net and seed}}}."""
    summary = {}
    for dataset in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["dataset"] == dataset]
        base = {(r["model"], r["seed"]): r for r in mine if r["setting"] == BEFORE}
        for setting in ("litert", "onnx", BEFORE, AFTER):
            picked = [r for r in mine if r["setting"] == setting]
            entry = {
                "n": len(picked),
                "agreement": _interval([100 * r["top1_agreement"] for r in picked]),
                "drop": _interval([r["accuracy_drop"] for r in picked]),
            }
            if setting == AFTER:
                pairs = [(r, base[r["model"], r["seed"]]) for r in picked]
                entry["change"] = {
                    "agreement": _interval(
                        [100 * (r["top1_agreement"] - b["top1_agreement"]) for r, b in pairs]
                    ),
                    "drop": _interval([r["accuracy_drop"] - b["accuracy_drop"] for r, b in pairs]),
                }
            summary.setdefault(dataset, {})[setting] = entry
    return summary


def interval_text(stat, signed=False) -> str:
    form = "{:+.2f}" if signed else "{:.2f}"
    low, high = stat["ci95"]
    return f"{form.format(stat['mean'])} [{form.format(low)}, {form.format(high)}]"


def table(rows) -> str:
    """`summarize` as Markdown."""
    lines = [
        "| data set | setting | nets x seeds | agreement (%) | drop (points) | "
        "change in agreement (points) | change in drop |",
        "|---|---|---|---|---|---|---|",
    ]
    for dataset, settings in summarize(rows).items():
        for setting, e in settings.items():
            change = e.get("change")
            changes = (
                [interval_text(change[k], True) for k in ("agreement", "drop")]
                if change
                else ["", ""]
            )
            lines.append(
                f"| {dataset} | {setting} | {e['n']} | {interval_text(e['agreement'])} | "
                f"{interval_text(e['drop'], True)} | {changes[0]} | {changes[1]} |"
            )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True, help="JSON lines, appended to")
    parser.add_argument("--dataset", choices=("digits", "fashion_mnist"))
    parser.add_argument("--models", nargs="+", default=[], help="hardened model.keras files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--calibration", type=int, default=500)
    parser.add_argument("--table", action="store_true", help="print the summary, measure nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(table(_read(args.rows)))
        return 0
    if not args.dataset or not args.models:
        parser.error("--dataset and --models are required unless --table")
    for path in args.models:
        study(path, args.dataset, args.seeds, args.calibration, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
