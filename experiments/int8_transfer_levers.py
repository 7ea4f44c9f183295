"""The int8 accuracy levers on the transfer study's fine-tuned nets (issue 53, item 2):
each finished transfer run of a `experiments.transfer_study` results folder (its
model.keras under `--work`), its int8 files made again from finetune's own calibration
images (`training.exports.int8_data`: the first training images, no augmentation) and
checked on its validation images against the float file, in several settings:

- "default": finetune's defaults (ONNX and OpenVINO 7-bit weights, min/max ranges; LiteRT's
  one scheme), `experiments.int8_levers`'s "7bit";
- "8bit": 8-bit weights (ONNX, OpenVINO; right on CPUs with VNNI);
- "augmented": calibration on the images plus one augmented view of each (all three);
- "k<k>": LiteRT with the `k` tensors of largest int8 error kept in float
  (`experiments.int8_sensitivity`), timed at batch 1 against the default file.

One row per (net, runtime, setting), appended to `--rows` (JSON lines) as it is
measured; a rerun skips the nets it holds. The summary pairs the settings by net (a
net: one fine-tuned model, `net`), 95% t intervals (`experiments.int8_levers.summarize`).

Usage:
    python -m experiments.int8_transfer_levers --results docs/results/transfer_int8 \
        --work runs/transfer_int8 --ks 8 [--table]
"""

import argparse
import json
import os
import shutil
import tempfile

from experiments import int8_levers, int8_sensitivity
from experiments.int8_accuracy import _row
from experiments.scale_study import append_row
from experiments.transfer_study import LEVERS_FILE, PLAN_FILE, ROWS_FILE, read_rows

BASE = "default"
# {setting: (runtimes, int8_levers' setting)}
SETTINGS = {
    BASE: (("litert", "onnx", "openvino"), "7bit"),
    "8bit": (("onnx", "openvino"), "8bit"),
    "augmented": (("litert", "onnx", "openvino"), "augmented"),
}


def run_split(run_folder: str, plan_settings: dict, images_root: str):
    """(training data, validation data) of a finished run as finetune read them: its
    recorded split (read from a copy), its image size and flips."""
    from keras_autoshuffle.data.image_folder import image_folder
    from keras_autoshuffle.finetuning.run_folder import SPLIT_FILE

    with tempfile.TemporaryDirectory() as scratch:
        record = os.path.join(scratch, SPLIT_FILE)
        shutil.copy(os.path.join(run_folder, SPLIT_FILE), record)
        train, val, _ = image_folder(
            images_root,
            image_size=plan_settings["image_size"],
            flip=plan_settings["flip"],
            record=record,
        )
    return train, val


def net_data(run_folder: str, plan_settings: dict, images_root: str):
    """(model, calibration images, (validation images, labels)) of a finished run, as
    finetune's int8 export had them (`run_split`)."""
    import keras

    from keras_autoshuffle.finetuning.run_folder import ALL_DIR
    from keras_autoshuffle.training.exports import int8_data

    train, val = run_split(run_folder, plan_settings, images_root)
    model = keras.saving.load_model(
        os.path.join(run_folder, ALL_DIR, "model.keras"), compile=False, safe_mode=True
    )
    calibration, test = int8_data(train, val)
    return model, calibration, test


def litert_inputs(folded, model, calibration, images):
    """(net, float file, calibration, test images) of LiteRT as finetune writes it: with
    the mediapipe extra installed, the net with its input normalisation inside, taking RGB
    in [0, 1] (`finetuning.run._export_unit_rgb_litert`); else the folded net."""
    from keras_autoshuffle import export
    from keras_autoshuffle.export import metadata
    from keras_autoshuffle.finetuning.run import _unit_rgb

    if not export.is_installed("mediapipe"):
        return folded, None, calibration, images
    net, reference = (metadata.with_input_normalization(m) for m in (folded, model))
    folder = tempfile.mkdtemp(prefix="int8_transfer_levers_")
    export.export_model(
        net, folder, _unit_rgb(images[:8]), formats=("litert",), reference=reference
    )
    return net, os.path.join(folder, "model.tflite"), _unit_rgb(calibration), _unit_rgb(images)


def measure_net(name, model, calibration, test, ks, latency_rounds, write):
    """Measures one net in every setting of `SETTINGS` and the LiteRT `k` files, each row
    given to `write` as it is measured (the pairing key `seed` is the net's name)."""
    from keras_autoshuffle import folding
    from keras_autoshuffle.export import int8
    from keras_autoshuffle.finetuning.run import _unit_rgb

    folded = folding.fold_model(model, name=model.name)
    images, labels = test
    float_outputs = model.predict(images, batch_size=256, verbose=0)
    files = int8_levers.Files(folded, model, images)
    net, lite_float, lite_calibration, lite_images = litert_inputs(
        folded, model, calibration, images
    )
    unit_rgb = lite_float is not None
    lite_float = lite_float or files.paths["litert"]
    base = {"net": name, "test_images": len(labels), "calibration_images": len(calibration)}
    sensitive = int8_sensitivity.measure(
        net,
        lite_float,
        lite_calibration,
        (lite_images, labels),
        float_outputs,
        ks,
        latency_rounds,
        1,
    )
    for setting, entry in sensitive.items():
        extra = {
            k: entry[k] for k in ("float_nodes", "latency_ms", "float_latency_ms") if k in entry
        }
        setting = BASE if setting == int8_sensitivity.BASE else setting
        write({**_row(name, "litert", entry), "setting": setting, **base, **extra})
    for setting, (runtimes, lever) in SETTINGS.items():
        augmented = setting == "augmented"
        chosen = int8_levers.augmented_views(calibration, 0) if augmented else calibration
        for runtime in runtimes:
            if runtime == "litert" and setting == BASE:
                continue  # measured above, with the latencies
            if runtime == "litert":  # finetune's LiteRT inputs (`litert_inputs`)
                views = _unit_rgb(chosen) if unit_rgb else chosen
                with tempfile.TemporaryDirectory() as folder:
                    entry = int8._export_int8_checked(
                        net,
                        os.path.join(folder, "int8.tflite"),
                        lite_float,
                        views,
                        lite_images,
                        labels,
                        float_outputs,
                        100.0,
                    )
            else:
                entry = int8_levers.measure(
                    runtime, lever, files, folded, chosen, test, float_outputs
                )
            extra = {k: v for k, v in entry.items() if k.startswith("avx2_")}
            write({**_row(name, runtime, entry), "setting": setting, **base, **extra})


def read_levers(path: str) -> list[dict]:
    """The rows of a levers file (none where it is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="the transfer study's results folder")
    parser.add_argument("--work", required=True, help="its --work folder (the runs)")
    parser.add_argument("--ks", type=int, nargs="+", default=[8])
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--table", action="store_true", help="print the summary, measure nothing")
    args = parser.parse_args(argv)
    levers_path = os.path.join(args.results, LEVERS_FILE)
    held = read_levers(levers_path)
    if args.table:
        print(int8_levers.table(int8_levers.summarize(held, BASE), BASE))
        return 0
    if any(k < 0 for k in args.ks):
        parser.error(f"--ks must be non-negative integers. Received: --ks {args.ks}")
    with open(os.path.join(args.results, PLAN_FILE)) as f:
        plan = json.load(f)
    done = {r["net"] for r in held}
    for row in read_rows(os.path.join(args.results, ROWS_FILE), plan["plan"]):
        if row["arm"] != "transfer" or row["name"] in done:
            continue
        images_root = os.path.join(
            args.work, "folders", f"target_{row['per_class']}_seed{row['seed']}"
        )
        model, calibration, test = net_data(
            os.path.join(args.work, "runs", row["name"]), plan["settings"], images_root
        )
        study = {"per_class": row["per_class"], "study_seed": row["seed"]}

        def write(measured, study=study):
            append_row(levers_path, {**measured, **study})
            print(json.dumps(measured), flush=True)

        measure_net(row["name"], model, calibration, test, args.ks, args.latency_rounds, write)
    print(int8_levers.table(int8_levers.summarize(read_levers(levers_path), BASE), BASE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
