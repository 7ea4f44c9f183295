"""The folded and no-shuffle ShuffleNet v2 1.0x files of one package version, and what each
runtime makes of them (issue 53, items 3 and 4). Not in CI.

Writes into `--out` the folded net (`folding.fold_model`) and the no-shuffle floor (the
manual net with Identity in place of each shuffle, `experiments.benchmark`) as LiteRT float
and int8 files and ONNX float and int8 files (LiteRT: one conv per slice,
`export.litert_graph`), and the folded net as a float LiteRT file with its slices, as
Keras's exporter writes it (`folded_slices.tflite`, `export_slices`); random seeded
weights, 224 x 224, 1000 classes (a file's speed does not depend on its values), int8
calibrated on 16 seeded random images; then `ops.json`: each LiteRT file's op counts and
XNNPACK delegate partitions, and each ONNX file's op counts in ONNX Runtime's optimized
graph (2 threads). Run it once
with this package and once with an earlier one on PYTHONPATH to compare the files of two
versions, then time them with `experiments.runtime_processes --files`.

Usage:
    PYTHONPATH=. python -m experiments.folded_files --out runs/folded_after
    PYTHONPATH=/path/to/older/checkout python experiments/folded_files.py --out runs/before
"""

import argparse
import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAMES = ("folded", "noshuffle")


def write(out):
    """{file name: path} of the four files of each net in NAMES."""
    import keras
    import numpy as np

    from keras_autoshuffle import applications, export, folding
    from keras_autoshuffle.export.int8_runtimes import export_onnx_int8
    from keras_autoshuffle.layers import ChannelShuffle

    def no_shuffle(layer):  # as experiments.benchmark._no_shuffle (importable from here)
        if isinstance(layer, ChannelShuffle):
            return keras.layers.Identity(name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    keras.utils.set_random_seed(0)
    model = applications.ShuffleNetV2(
        1.0, input_shape=(224, 224, 3), classes=1000, classifier_activation=None
    )
    nets = {
        "folded": folding.fold_model(model),
        "noshuffle": keras.models.clone_model(model, clone_function=no_shuffle),
    }
    nets["noshuffle"].set_weights(model.get_weights())
    images = np.random.default_rng(0).uniform(0, 255, (16, 224, 224, 3)).astype("float32")
    files = {}
    for name, net in nets.items():
        path = os.path.join(out, name)
        files[f"{name}.tflite"] = export.export_litert(net, f"{path}.tflite")
        files[f"{name}_int8.tflite"] = export.export_int8(net, f"{path}_int8.tflite", images)
        files[f"{name}.onnx"] = export.export_onnx(net, f"{path}.onnx")
        files[f"{name}_int8.onnx"] = export_onnx_int8(f"{path}.onnx", f"{path}_int8.onnx", images)
    # The float folded net with its slices: `export_litert` writes one conv per slice.
    slices = os.path.join(out, "folded_slices.tflite")
    files["folded_slices.tflite"] = export_slices(nets["folded"], slices)
    return files


def export_slices(net, path):
    """`net` as a LiteRT file with its slices (Keras's exporter alone): the float file
    `export.export_litert` wrote before it wrote one conv per slice."""
    from keras_autoshuffle._atomic import write_atomically

    return write_atomically(
        path, lambda partial: net.export(partial, format="litert", verbose=False)
    )


def litert_ops(path):
    """{op name: count} of a `.tflite` file in the interpreter with XNNPACK (DELEGATE: one
    per delegate partition; the delegated nodes stay listed)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=2)
    try:
        interpreter.allocate_tensors()
    except RuntimeError as error:  # XNNPACK refused the file: say so in the row
        return {"error": str(error).splitlines()[0]}
    return dict(collections.Counter(op["op_name"] for op in interpreter._get_ops_details()))


def onnxruntime_ops(path, scratch):
    """{op type: count} of ONNX Runtime's optimized graph of `path` (2 threads)."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.optimized_model_filepath = scratch
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(collections.Counter(node.op_type for node in onnx.load(scratch).graph.node))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    files = write(args.out)
    scratch = os.path.join(args.out, "optimized.onnx")
    ops = {
        name: litert_ops(path) if name.endswith(".tflite") else onnxruntime_ops(path, scratch)
        for name, path in files.items()
    }
    os.remove(scratch)
    with open(os.path.join(args.out, "ops.json"), "w") as f:
        json.dump(ops, f, indent=1)
    print(json.dumps(ops, indent=1))


if __name__ == "__main__":
    main()
