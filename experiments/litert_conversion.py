"""LiteRT conversion, Keras's route against the package's, side by side.

    python -m experiments.litert_conversion --json docs/results/litert_conversion.json

In one process, in interleaved rounds: a folded ShuffleNet v2 (random seeded weights, at
224, written as `export.export_litert` writes it: one conv per slice) converted to a
float and to an int8 (16 calibration images) LiteRT flat buffer by

- "keras": `model.export(format="litert")`, which writes a SavedModel and converts it
  (the package's route before this change);
- "frozen": `export.files.litert_flatbuffer`, the traced call with its variables frozen.

Before timing, each pair of files is compared: their operators (by name and count) and
their outputs on the calibration images (the largest difference). Rows: the seconds of
each (width, file, route) per round, and frozen over keras per round (median, 95%
bootstrap interval: `experiments.timing.paired_ratio`).
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from experiments.finetune_throughput import environment, write_rows  # noqa: E402
from experiments.timing import paired_ratio  # noqa: E402


def routes(model, calibration):
    """{(file, route): a function of no arguments returning the flat buffer's bytes}."""
    import tensorflow as tf

    from keras_autoshuffle.export.files import litert_flatbuffer

    def representative_dataset():
        for image in calibration:
            yield [image[None]]

    ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    quantize = dict(optimizations=[tf.lite.Optimize.DEFAULT])
    quantize["representative_dataset"] = representative_dataset

    def keras_route(**settings):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.tflite")
            model.export(path, format="litert", verbose=False, **settings)
            with open(path, "rb") as f:
                return f.read()

    return {
        ("float", "keras"): lambda: keras_route(),
        ("float", "frozen"): lambda: litert_flatbuffer(model),
        ("int8", "keras"): lambda: keras_route(**quantize, target_spec={"supported_ops": ops}),
        ("int8", "frozen"): lambda: litert_flatbuffer(
            model, **quantize, target_spec=tf.lite.TargetSpec(ops)
        ),
    }


def describe(content, images):
    """(operator counts, outputs on `images`) of a flat buffer."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    outputs = []
    for image in images:
        interpreter.set_tensor(source["index"], image[None])
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(target["index"])[0].copy())
    counts = collections.Counter(op["op_name"] for op in interpreter._get_ops_details())
    return counts, np.array(outputs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    from keras_autoshuffle import folding
    from keras_autoshuffle.applications import ShuffleNetV2
    from keras_autoshuffle.export.litert_graph import one_conv_per_slice

    rows, checks = [], []
    for width in args.widths:
        calibration = np.random.default_rng(0).normal(size=(16, 224, 224, 3)).astype("float32")
        model = one_conv_per_slice(folding.fold_model(ShuffleNetV2(width, weights=None)))
        convert = routes(model, calibration)
        for kind in ("float", "int8"):
            keras_ops, keras_out = describe(convert[kind, "keras"](), calibration)
            frozen_ops, frozen_out = describe(convert[kind, "frozen"](), calibration)
            checks.append(
                {
                    "width": width,
                    "file": kind,
                    "same_operators": keras_ops == frozen_ops,
                    "largest_difference": float(np.max(np.abs(keras_out - frozen_out))),
                }
            )
            print(json.dumps(checks[-1]), flush=True)
        seconds = collections.defaultdict(list)
        for _ in range(args.repeats):
            for name, function in convert.items():
                start = time.perf_counter()
                function()
                seconds[name].append(time.perf_counter() - start)
        for kind in ("float", "int8"):
            for route in ("keras", "frozen"):
                rounds = seconds[kind, route]
                rows.append(
                    {
                        "width": width,
                        "file": kind,
                        "route": route,
                        "seconds": float(np.median(rounds)),
                        "rounds": [round(s, 2) for s in rounds],
                    }
                )
            ratio = paired_ratio(seconds[kind, "frozen"], seconds[kind, "keras"])
            rows.append(
                {"width": width, "file": kind, "frozen_over_keras": [round(v, 3) for v in ratio]}
            )
            print(json.dumps(rows[-3:]), flush=True)
    document = {
        "experiment": "litert_conversion",
        "command": "python -m experiments.litert_conversion "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "rounds": args.repeats,
        "checks": checks,
        "rows": rows,
    }
    write_rows(args.json, document)


if __name__ == "__main__":
    main()
