"""ONNX Runtime's int8 file with each concatenation's inputs at its output's range (issue
53, item 3), against the plain one: the profile (`experiments.ort_op_profile`) showed the
int8 file's QLinearConcat taking 1.48x the float Concat's time, requantizing inputs
calibrated apart. `export_onnx_int8` now gives every tensor a Concat or a Split joins the
union of its group's calibrated range (`int8_runtimes._joined_ranges`); `plain()` turns that
off, for the paired comparison. Not in CI.

Usage (the project's venv; the files of `experiments.int8_peers write`):
    python -m experiments.ort_concat_ranges file --float runs/int8_peers/ours/model.onnx \
        --calibration runs/int8_peers/calibration.npy \
        --out runs/int8_peers/ours/model_int8_joined.onnx   # and ..._joined_plain.onnx
and on the transfer study's fine-tuned nets (accuracy and agreement, paired by net against
the same nets' plain int8 files; rows appended to --rows):
    python -m experiments.ort_concat_ranges transfer --results docs/results/transfer_int8 \
        --work runs/transfer_int8 --rows docs/results/transfer_int8/ort_joined_ranges.jsonl
Time it against the package's int8 and float files, each process alone:
    python -m experiments.runtime_processes --runtime onnxruntime --files \
        float=runs/int8_peers/ours/model.onnx int8=runs/int8_peers/ours/model_int8.onnx \
        joined=runs/int8_peers/ours/model_int8_joined.onnx --processes 6
(the measured `int8` file was the plain one: `int8_peers write` before the change).
"""

import argparse
import contextlib
import os
import tempfile
from unittest import mock

import numpy as np


def plain():
    """`export_onnx_int8` as it was before the joined ranges, in a `with` block: every
    tensor at its own calibrated range (no `TensorQuantOverrides`)."""
    from keras_autoshuffle.export import int8_runtimes

    # The paired comparison needs the plain file, which no user should: a patch, not an option.
    return mock.patch.object(int8_runtimes, "_joined_ranges", lambda *args: {})


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
        for setting in ("plain", "joined"):
            with tempfile.TemporaryDirectory() as folder:
                writing = plain() if setting == "plain" else contextlib.nullcontext()
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
            }
            with open(args.rows, "a") as f:
                f.write(json.dumps(out) + "\n")
            print(json.dumps(out), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("file", help="one float file's int8 files, joined and plain")
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
    # The package's file (joined ranges) and, beside it, the plain one (`_plain.onnx`).
    int8_runtimes.export_onnx_int8(args.float, args.out, images)
    with plain():
        int8_runtimes.export_onnx_int8(args.float, args.out.replace(".onnx", "_plain.onnx"), images)


if __name__ == "__main__":
    main()
