"""OpenVINO's int8 file with and without NNCF's fast bias correction (on by default in
`nncf.quantize`), on the fine-tuned nets of an `experiments.transfer_study` results folder:
otherwise the export's settings (min/max ranges, 7-bit weights), each net's own calibration
and validation images (`int8_transfer_levers.net_data`), top-1 agreement with the float
Keras model and the int8 outputs' relative RMS error. A screening, not in CI.

Usage:
    python -m experiments.openvino_bias_correction --results runs/transfer_regen \
        --work runs/transfer_int8 --rows docs/results/openvino_bias_correction.jsonl
"""

import argparse
import contextlib
import io
import json
import os
import tempfile

import numpy as np

from experiments import int8_transfer_levers
from experiments.int8_equalize import relative_error
from experiments.scale_study import append_row
from experiments.transfer_study import PLAN_FILE, ROWS_FILE, read_rows


def main(argv=None):
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    from keras_autoshuffle import export, folding
    from keras_autoshuffle.export.runner import open_runner

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--rows", required=True)
    args = parser.parse_args(argv)
    with open(os.path.join(args.results, PLAN_FILE)) as f:
        plan = json.load(f)
    for row in read_rows(os.path.join(args.results, ROWS_FILE), plan["plan"]):
        if row["arm"] != "transfer":
            continue
        folder = os.path.join(args.work, "runs", row["name"])
        root = os.path.join(args.work, "folders", f"target_{row['per_class']}_seed{row['seed']}")
        model, calibration, (images, labels) = int8_transfer_levers.net_data(
            folder, plan["settings"], root
        )
        expected = model.predict(images, verbose=0)
        with tempfile.TemporaryDirectory() as scratch:
            export.export_model(
                folding.fold_model(model), scratch, images[:8], formats=("openvino",)
            )
            ir = openvino.Core().read_model(os.path.join(scratch, "openvino", "model.xml"))
            dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
            advanced = AdvancedQuantizationParameters(
                overflow_fix=OverflowFix.ENABLE,
                activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
            )
            for setting, correct in (("default", True), ("no_fast_bias_correction", False)):
                with contextlib.redirect_stdout(io.StringIO()):
                    quantized = nncf.quantize(
                        ir,
                        dataset,
                        subset_size=len(calibration),
                        advanced_parameters=advanced,
                        fast_bias_correction=correct,
                    )
                path = os.path.join(scratch, setting)
                openvino.save_model(
                    quantized, os.path.join(path, "model.xml"), compress_to_fp16=False
                )
                outputs = open_runner(path).run(images)
                measured = {
                    "net": row["name"],
                    "setting": setting,
                    "top1_agreement": float(np.mean(outputs.argmax(-1) == expected.argmax(-1))),
                    "accuracy_drop": 100
                    * float(
                        np.mean(expected.argmax(-1) == labels)
                        - np.mean(outputs.argmax(-1) == labels)
                    ),
                    "relative_error": relative_error(outputs, expected),
                    "test_images": len(labels),
                }
                append_row(args.rows, measured)
                print(json.dumps(measured), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
