"""Are the int8 files' disagreements with float ties of their quantized outputs? (issue 53,
item 2). ONNX Runtime's int8 file of the Fashion-MNIST net of `experiments.openvino_ranges`
quantizes the classifier's logits and its softmax to 8 bits, so two classes within one step
tie and the lowest index wins. Here it is written as the package writes it and with the
classifier and the softmax left in float (`float_nodes`: no ties), from the 500 training
images drawn with each seed, and checked on the 10,000 test images against the Keras model.
One JSON line per seed and setting on stdout, with the count of tied top-1 outputs. Not in CI.

Usage (the rows of docs/results/int8_head_float_fm.jsonl):
    python -m experiments.int8_head_float runs/ovr/fm_v2/model.keras 0 1 2 3 4
"""

import json
import sys
import tempfile

import numpy as np


def main(argv=None):
    import keras
    import onnx

    from keras_autoshuffle import data, export, folding
    from keras_autoshuffle.export import int8_runtimes
    from keras_autoshuffle.export.runner import open_runner

    path, *seeds = argv or sys.argv[1:]
    model = keras.saving.load_model(path, safe_mode=True)
    train, test = data.fashion_mnist(seed=0, augment=False)
    folded = folding.fold_model(model, name=model.name)
    folder = tempfile.mkdtemp()
    export.export_model(folded, folder, test.images[:8], formats=("onnx",), reference=model)
    float_path = f"{folder}/model.onnx"
    expected = model.predict(test.images, batch_size=256, verbose=0).argmax(-1)
    graph = onnx.load(float_path).graph
    head = [n.name for n in graph.node if n.op_type in ("Gemm", "MatMul", "Softmax")]
    for seed in map(int, seeds):
        pick = np.random.default_rng(seed).choice(len(train.images), 500, False)
        calibration = train.images[np.sort(pick)]
        for name, nodes in (("onnx", []), ("onnx_head_float", head)):
            int8_path = f"{tempfile.mkdtemp()}/model_int8.onnx"
            int8_runtimes.export_onnx_int8(float_path, int8_path, calibration, float_nodes=nodes)
            outputs = open_runner(int8_path).run(test.images)
            got = outputs.argmax(-1)
            tied = int(np.sum(np.sum(outputs == outputs.max(-1, keepdims=True), -1) > 1))
            drop = 100 * (np.mean(expected == test.labels) - np.mean(got == test.labels))
            row = {"seed": seed, "setting": name, "top1_agreement": float(np.mean(got == expected))}
            row.update(accuracy_drop=float(drop), tied_top1=tied, test_images=len(test.labels))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
