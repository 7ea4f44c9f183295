"""ONNX Runtime's int8 file with each concatenation's inputs at its output's range (issue
53, item 3): the profile (`experiments.ort_op_profile`) shows the int8 file's QLinearConcat
taking 1.48x the float Concat's time, requantizing inputs calibrated apart. Here the float
file's activation ranges are calibrated once (MinMax, as `export_onnx_int8`), every tensor
joined by a Concat or a Split (inputs and outputs) gets the union of their ranges
(ONNX Runtime's `TensorQuantOverrides`), and the file is written by the package's own
`export_onnx_int8` otherwise unchanged. Not in CI; not offered (an experiment).

Usage (the project's venv; the files of `experiments.int8_peers write`):
    python -m experiments.ort_concat_ranges file --float runs/int8_peers/ours/model.onnx \
        --calibration runs/int8_peers/calibration.npy \
        --out runs/int8_peers/ours/model_int8_joined.onnx
and on the transfer study's fine-tuned nets (accuracy and agreement, paired by net against
the same nets' plain int8 files; rows appended to --rows):
    python -m experiments.ort_concat_ranges transfer --results docs/results/transfer_int8 \
        --work runs/transfer_int8 --rows docs/results/transfer_int8/ort_joined_ranges.jsonl
Time it against the package's int8 and float files, each process alone:
    python -m experiments.runtime_processes --runtime onnxruntime --files \
        float=runs/int8_peers/ours/model.onnx int8=runs/int8_peers/ours/model_int8.onnx \
        joined=runs/int8_peers/ours/model_int8_joined.onnx --processes 6
"""

import argparse
import contextlib
import os
import tempfile

import numpy as np


def joined_ranges(float_path, images):
    """{tensor: (rmin, rmax)}: MinMax ranges on `images`, each Concat's and Split's inputs
    and outputs given the union of their group's (groups joined transitively)."""
    import onnx
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from keras_autoshuffle.export.int8_runtimes import _calibration_reader

    graph = onnx.load(str(float_path), load_external_data=False).graph
    with tempfile.TemporaryDirectory() as scratch:
        calibrator = create_calibrator(
            str(float_path),
            augmented_model_path=f"{scratch}/augmented.onnx",
            calibrate_method=CalibrationMethod.MinMax,
        )
        name = graph.input[0].name
        calibrator.collect_data(_calibration_reader(name, images.astype("float32")))
        ranges = {
            k: tuple(float(np.asarray(v).item()) for v in data.range_value)
            for k, data in calibrator.compute_data().data.items()
        }
    parent = {t: t for t in ranges}

    def root(t):
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for node in graph.node:
        if node.op_type in ("Concat", "Split"):
            tensors = [t for t in (*node.input, *node.output) if t in ranges]
            for t in tensors[1:]:
                parent[root(t)] = root(tensors[0])
    groups = {}
    for t in ranges:
        groups.setdefault(root(t), []).append(t)
    joined = {}
    for members in groups.values():
        if len(members) > 1:
            low = min(ranges[t][0] for t in members)
            high = max(ranges[t][1] for t in members)
            joined.update({t: (low, high) for t in members})
    return joined


@contextlib.contextmanager
def range_overrides(joined):
    """`onnxruntime.quantization.quantize_static` with these ranges as TensorQuantOverrides."""
    import onnxruntime.quantization as quantization

    original = quantization.quantize_static
    overrides = {
        t: [{"rmin": np.float32(lo), "rmax": np.float32(hi)}] for t, (lo, hi) in joined.items()
    }

    def quantize_static(*args, **kwargs):
        kwargs["extra_options"] = {
            **kwargs.get("extra_options", {}),
            "TensorQuantOverrides": overrides,
        }
        return original(*args, **kwargs)

    quantization.quantize_static = quantize_static
    try:
        yield
    finally:
        quantization.quantize_static = original


def transfer(args):
    """Each transfer net's ONNX int8 file, plain and with joined ranges, checked as the
    fine-tune checks it (`export_int8_file_checked`, limits opened): one row per file."""
    import json

    from experiments import int8_levers, int8_transfer_levers
    from keras_autoshuffle import folding
    from keras_autoshuffle.export import int8_runtimes

    with open(os.path.join(args.results, int8_transfer_levers.PLAN_FILE)) as f:
        plan = json.load(f)
    rows = int8_transfer_levers.read_rows(
        os.path.join(args.results, int8_transfer_levers.ROWS_FILE), plan["plan"]
    )
    for row in rows:
        if row["arm"] != "transfer":
            continue
        name = row["name"]
        images_root = os.path.join(
            args.work, "folders", f"target_{row['per_class']}_seed{row['seed']}"
        )
        model, calibration, test = int8_transfer_levers.net_data(
            os.path.join(args.work, "runs", name), plan["settings"], images_root
        )
        folded = folding.fold_model(model, name=model.name)
        float_outputs = model.predict(test[0], batch_size=256, verbose=0)
        files = int8_levers.Files(folded, model, test[0])
        float_path = files.paths["onnx"]
        joined = joined_ranges(float_path, calibration)
        for setting in ("plain", "joined"):
            with tempfile.TemporaryDirectory() as folder:
                writing = (
                    range_overrides(joined) if setting == "joined" else contextlib.nullcontext()
                )
                with writing:
                    entry = int8_runtimes.export_int8_file_checked(
                        "onnx_int8",
                        float_path,
                        os.path.join(folder, "int8.onnx"),
                        calibration,
                        test,
                        float_outputs,
                        100.0,
                    )
            out = {
                "net": name,
                "setting": setting,
                "top1_agreement": entry["top1_agreement"],
                "accuracy_drop": entry["accuracy_drop"],
                "joined_tensors": len(joined),
                "joined_ranges": len(set(joined.values())),
            }
            with open(args.rows, "a") as f:
                f.write(json.dumps(out) + "\n")
            print(json.dumps(out), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("file", help="one float file's int8 file with joined ranges")
    one.add_argument("--float", required=True)
    one.add_argument("--calibration", required=True)
    one.add_argument("--out", required=True)
    nets = commands.add_parser("transfer", help="the transfer study's nets, plain and joined")
    nets.add_argument("--results", required=True)
    nets.add_argument("--work", required=True)
    nets.add_argument("--rows", required=True)
    args = parser.parse_args(argv)
    if args.command == "transfer":
        return transfer(args)
    from keras_autoshuffle.export import int8_runtimes

    images = np.load(args.calibration)
    joined = joined_ranges(args.float, images)
    print(f"{len(joined)} tensors joined into {len(set(joined.values()))} ranges")
    with range_overrides(joined):
        int8_runtimes.export_onnx_int8(args.float, args.out, images)


if __name__ == "__main__":
    main()
