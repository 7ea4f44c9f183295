"""The int8 accuracy levers side by side (issue 53, item 2): each runtime's int8 file of
the Fashion-MNIST net of `experiments.int8_accuracy`, quantized in several settings from
the same calibration images per seed, checked on the test images against the float
model; summarized per setting (mean agreement and drop over seeds, 95% t intervals) and
as paired differences from today's setting (7-bit weights, min/max ranges). Not in CI.

Settings (`SETTINGS`): the weights' bits (ONNX Runtime's `reduce_range`, NNCF's overflow
fix; 8 bits are right only on CPUs with VNNI), the calibration method ("percentile"),
the first convolution or the first and last layers left in float (`float_nodes`), and
calibration on the images plus one augmented view of each (the training's pad-2 crop and
flip). LiteRT has no weight-bits or calibration-method choice (8-bit symmetric weights,
min/max ranges): its rows are today's file and the augmented calibration.

One row per seed, runtime and setting goes to `--json` as it is measured; a rerun skips
the (seed, setting) pairs it holds.

Usage:
    python -m experiments.int8_levers --model runs/fm_v2/model.keras \
        --json docs/results/int8_levers.json --seeds 0 1 2 3 4 [--test-images 2000]
"""

import argparse
import json
import os
import tempfile

import numpy as np

from experiments.int8_accuracy import _interval, _row

BASE = "7bit"
# {setting: (runtimes, writer options, which layers stay float, augmented calibration)}
SETTINGS = {
    BASE: (("litert", "onnx", "openvino"), {}, "", False),
    "8bit": (("onnx", "openvino"), {"weight_bits": 8}, "", False),
    "percentile": (("onnx", "openvino"), {"calibration_method": "percentile"}, "", False),
    "8bit_percentile": (
        ("onnx", "openvino"),
        {"weight_bits": 8, "calibration_method": "percentile"},
        "",
        False,
    ),
    "augmented": (("litert", "onnx", "openvino"), {}, "", True),
    "first_float": (("onnx", "openvino"), {}, "first", False),
    "8bit_percentile_first_float": (
        ("onnx", "openvino"),
        {"weight_bits": 8, "calibration_method": "percentile"},
        "first",
        False,
    ),
    "ends_float": (("onnx", "openvino"), {}, "ends", False),
    "8bit_first_float": (("onnx", "openvino"), {"weight_bits": 8}, "first", False),
}


def augmented_views(images: np.ndarray, seed: int) -> np.ndarray:
    """`images` followed by one view of each through the training's augmentation (zero
    pad by 2, random crop back, random horizontal flip), drawn with `seed`."""
    import tensorflow as tf

    from keras_autoshuffle.data import transforms

    views = [
        transforms.pad_crop_flip(tf.constant(image), tf.constant([seed, i]), padding=2).numpy()
        for i, image in enumerate(images)
    ]
    return np.concatenate([images, np.stack(views)])


class Files:
    """The float files of the folded net (written once) and the names of the nodes the
    `float_nodes` settings keep in float: the first convolution, and with it the last
    layer (ONNX: the last Conv or Gemm; OpenVINO: the last Convolution or MatMul)."""

    def __init__(self, folded, model, images):
        import onnx
        import openvino

        from keras_autoshuffle import export
        from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

        self._scratch = tempfile.TemporaryDirectory()
        self.folder = self._scratch.name
        export.export_model(
            folded,
            self.folder,
            images[:8],
            formats=("litert", "onnx", "openvino"),
            reference=model,
        )
        graph = onnx.load(os.path.join(self.folder, "model.onnx")).graph
        onnx_layers = [n.name for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
        ir = openvino.Core().read_model(os.path.join(self.folder, "openvino", OPENVINO_XML))
        openvino_layers = [
            op.get_friendly_name()
            for op in ir.get_ordered_ops()
            if op.get_type_name() in ("Convolution", "MatMul")
        ]
        self.float_nodes = {
            "onnx": {"": [], "first": onnx_layers[:1], "ends": [onnx_layers[0], onnx_layers[-1]]},
            "openvino": {
                "": [],
                "first": openvino_layers[:1],
                "ends": [openvino_layers[0], openvino_layers[-1]],
            },
        }
        self.paths = {
            "litert": os.path.join(self.folder, "model.tflite"),
            "onnx": os.path.join(self.folder, "model.onnx"),
            "openvino": os.path.join(self.folder, "openvino"),
        }


def measure(runtime, setting, files, folded, calibration, test, float_outputs):
    """The check's entry of `runtime`'s int8 file in `setting` (limits opened)."""
    from keras_autoshuffle.export import int8, int8_runtimes

    _, options, floats, _ = SETTINGS[setting]
    with tempfile.TemporaryDirectory() as folder:
        if runtime == "litert":
            return int8._export_int8_checked(
                folded,
                os.path.join(folder, "int8.tflite"),
                files.paths["litert"],
                calibration,
                *test,
                float_outputs,
                100.0,
            )
        entry = int8_runtimes.export_int8_file_checked(
            f"{runtime}_int8",
            files.paths[runtime],
            # A suffix `open_runner` reads (".onnx"); OpenVINO's file is a folder.
            os.path.join(folder, "int8.onnx" if runtime == "onnx" else "openvino_int8"),
            calibration,
            test,
            float_outputs,
            100.0,  # never refused: every file is measured
            float_nodes=files.float_nodes[runtime][floats],
            **options,
        )
        if runtime == "openvino" and not floats:
            classes = capped_classes(entry["path"], test[0])
            entry["avx2_top1_agreement"] = float(np.mean(classes == float_outputs.argmax(-1)))
            entry["avx2_accuracy"] = float(np.mean(classes == test[1]))
        return entry


# The OpenVINO files run again with oneDNN capped at AVX2 (`ONEDNN_MAX_CPU_ISA`): the
# int8 kernels of a CPU without VNNI (its exec graph then names jit_avx2 I8 primitives),
# emulated on this one. In a child process: oneDNN reads the cap once, when it loads.
_CAPPED_RUN = """
import sys
import numpy as np
from keras_autoshuffle.export import open_runner
np.save(sys.argv[3], np.argmax(open_runner(sys.argv[1]).run(np.load(sys.argv[2])), -1))
"""


def capped_classes(folder: str, images: np.ndarray, isa: str = "AVX2") -> np.ndarray:
    """Top-1 classes of the OpenVINO IR `folder` on `images`, run with oneDNN capped at
    `isa` in a child process."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as scratch:
        inputs, outputs = os.path.join(scratch, "x.npy"), os.path.join(scratch, "y.npy")
        np.save(inputs, images)
        subprocess.run(
            [sys.executable, "-c", _CAPPED_RUN, folder, inputs, outputs],
            check=True,
            env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa},
            capture_output=True,
        )
        return np.load(outputs)


def study_net(path: str, test_images: int):
    """The Fashion-MNIST net at `path` and its data: (the net, the training split, the first
    `test_images` test images, their labels, the folded net)."""
    import keras

    from keras_autoshuffle import data, folding

    model = keras.saving.load_model(path, safe_mode=True)
    train, test = data.fashion_mnist(seed=0, augment=False)
    folded = folding.fold_model(model, name=model.name)
    return model, train, test.images[:test_images], test.labels[:test_images], folded


def summarize(rows, base_setting=BASE):
    """{runtime: {setting: agreement and drop, mean and 95% t interval over seeds, and
    the paired difference from `base_setting` of the same seed}}."""
    base = {(r["seed"], r["runtime"]): r for r in rows if r["setting"] == base_setting}
    summary = {}
    for r in rows:
        summary.setdefault(r["runtime"], {}).setdefault(r["setting"], [])
    for runtime, settings in summary.items():
        for setting in settings:
            picked = [r for r in rows if r["runtime"] == runtime and r["setting"] == setting]
            paired = [(r, base[r["seed"], runtime]) for r in picked if (r["seed"], runtime) in base]
            capped = [r["avx2_top1_agreement"] for r in picked if "avx2_top1_agreement" in r]
            settings[setting] = {
                "seeds": len(picked),
                **({"avx2_top1_agreement": _interval(capped)} if capped else {}),
                **{
                    name: _interval([r[name] for r in picked])
                    for name in ("top1_agreement", "accuracy_drop")
                },
                "minus_base": {
                    name: _interval([r[name] - b[name] for r, b in paired])
                    for name in ("top1_agreement", "accuracy_drop")
                },
            }
    return summary


def _points(interval, scale=100.0, sign=False):
    """'mean [low, high]' of an `_interval`, times `scale`, 2 decimals."""
    form = "{:+.2f}" if sign else "{:.2f}"
    mean, (low, high) = interval["mean"], interval["ci95"]
    return f"{form.format(scale * mean)} [{form.format(scale * low)}, {form.format(scale * high)}]"


def table(summary: dict, base_setting: str = BASE) -> str:
    """The summary as a Markdown table: per runtime and setting, top-1 agreement (%) and
    accuracy drop (points), mean [95% interval] over the seeds, and their paired change
    from `base_setting`."""
    lines = [
        "| runtime | setting | seeds | agreement (%) | change (points) | drop (points) | change "
        "| agreement, AVX2 kernels (%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for runtime, settings in summary.items():
        for setting, s in settings.items():
            change = s["minus_base"]
            lines.append(
                f"| {runtime} | {setting} | {s['seeds']} | {_points(s['top1_agreement'])} | "
                + ("" if setting == base_setting else _points(change["top1_agreement"], sign=True))
                + f" | {_points(s['accuracy_drop'], 1.0)} | "
                + (
                    ""
                    if setting == base_setting
                    else _points(change["accuracy_drop"], 1.0, sign=True)
                )
                + f" | {_points(s['avx2_top1_agreement']) if 'avx2_top1_agreement' in s else ''} |"
            )
    return "\n".join(lines)


def merge(paths: list[str], target: str) -> None:
    """Writes into `target` the rows of `paths` (one run's seeds each; their settings but
    the command must agree), their commands, and the summary."""
    from keras_autoshuffle._atomic import write_json

    rows, commands, settings = [], [], None
    for path in paths:
        with open(path) as f:
            held = json.load(f)
        own = {k: v for k, v in held["settings"].items() if k != "command"}
        if settings is not None and own != settings:
            raise SystemExit(f"{path} was measured with other settings: {own}")
        settings = own
        commands.append(held["settings"]["command"])
        rows += held["rows"]
    content = {"settings": {**settings, "commands": commands}, "rows": rows}
    write_json(target, {**content, "summary": summarize(rows)})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a hardened model.keras")
    parser.add_argument("--json", required=True, help="rows file (appended to, per seed)")
    parser.add_argument(
        "--table", action="store_true", help="print the rows' summary as Markdown, measure nothing"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="ROWS",
        help="write into --json the rows of these files (runs of other seeds, same net and "
        "images), measure nothing",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--calibration", type=int, default=500)
    parser.add_argument("--test-images", type=int, default=10000)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args(argv)
    if args.table:
        with open(args.json) as f:
            print(table(summarize(json.load(f)["rows"])))
        return 0
    if args.merge:
        merge(args.merge, args.json)
        return 0
    if not args.model:
        parser.error("--model is required unless --table or --merge")

    from keras_autoshuffle._atomic import write_json
    from keras_autoshuffle.export import int8_runtimes
    from keras_autoshuffle.finetuning.report import cpu_name

    model, train, images, labels, folded = study_net(args.model, args.test_images)
    settings = {
        "model": os.path.abspath(args.model),
        "calibration_images": args.calibration,
        "test_images": len(labels),
        "cpu": cpu_name(),
        "cpu_has_vnni": int8_runtimes.cpu_has_vnni(),
        "command": "python -m experiments.int8_levers " + " ".join(argv or os.sys.argv[1:]),
    }
    rows = []
    if os.path.exists(args.json):
        with open(args.json) as f:
            held = json.load(f)
        if {k: v for k, v in held["settings"].items() if k != "command"} != {
            k: v for k, v in settings.items() if k != "command"
        }:
            raise SystemExit(f"{args.json} holds rows of other settings: {held['settings']}")
        rows = held["rows"]
    done = {(r["seed"], r["setting"]) for r in rows}
    files = Files(folded, model, images)
    float_outputs = model.predict(images, batch_size=256, verbose=0)
    for seed in args.seeds:
        pick = np.random.default_rng(seed).choice(len(train.images), args.calibration, False)
        calibration = train.images[np.sort(pick)]
        for setting in args.settings:
            if (seed, setting) in done:
                continue
            runtimes, _, _, augmented = SETTINGS[setting]
            chosen = augmented_views(calibration, seed) if augmented else calibration
            for runtime in runtimes:
                entry = measure(
                    runtime, setting, files, folded, chosen, (images, labels), float_outputs
                )
                extra = {k: v for k, v in entry.items() if k.startswith("avx2_")}
                rows.append({**_row(seed, runtime, entry), "setting": setting, **extra})
                print(json.dumps(rows[-1]), flush=True)
            write_json(args.json, {"settings": settings, "rows": rows, "summary": summarize(rows)})
    print(json.dumps(summarize(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
