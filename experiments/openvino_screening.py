"""A screening of NNCF settings on the Fashion-MNIST net of `experiments.openvino_ranges`
(issue 53, item 2): OpenVINO int8 files with min/max ranges and 7-bit weights (today's),
with NNCF's MIXED preset (asymmetric activations), and with 8-bit weights, each from the 500
training images drawn with the seed, checked on the 10,000 test images against the Keras
model. One JSON line per seed and setting on stdout. Not in CI.

Usage (the rows of docs/results/openvino_settings_screening_fm.jsonl):
    for s in 0 1 2 3 4; do
        python -m experiments.openvino_screening runs/ovr/fm_v2/model.keras $s
    done
"""

import contextlib
import io
import json
import sys
import tempfile

import numpy as np


def main(argv=None):
    import keras
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    from keras_autoshuffle import data, export, folding
    from keras_autoshuffle.export.runner import open_runner

    path, seed = (argv or sys.argv[1:])[:2]
    seed = int(seed)
    model = keras.saving.load_model(path, safe_mode=True)
    train, test = data.fashion_mnist(seed=0, augment=False)
    folded = folding.fold_model(model, name=model.name)
    folder = tempfile.mkdtemp()
    export.export_model(folded, folder, test.images[:8], formats=("openvino",), reference=model)
    expected = model.predict(test.images, batch_size=256, verbose=0).argmax(-1)
    pick = np.random.default_rng(seed).choice(len(train.images), 500, False)
    calibration = train.images[np.sort(pick)]
    ir = openvino.Core().read_model(f"{folder}/openvino/model.xml")
    base = {
        "overflow_fix": OverflowFix.ENABLE,
        "activations_range_estimator_params": RangeEstimatorParametersSet.MINMAX,
    }
    settings = {
        "minmax (now)": ({}, base),
        "minmax mixed": ({"preset": nncf.QuantizationPreset.MIXED}, base),
        "minmax 8bit": ({}, {**base, "overflow_fix": OverflowFix.DISABLE}),
    }
    for name, (options, advanced) in settings.items():
        dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(
                ir,
                dataset,
                subset_size=len(calibration),
                advanced_parameters=AdvancedQuantizationParameters(**advanced),
                **options,
            )
        out = tempfile.mkdtemp()
        openvino.save_model(quantized, f"{out}/model.xml", compress_to_fp16=False)
        got = open_runner(out).run(test.images).argmax(-1)
        drop = 100 * (np.mean(expected == test.labels) - np.mean(got == test.labels))
        row = {"seed": seed, "setting": name, "top1_agreement": float(np.mean(got == expected))}
        row.update(accuracy_drop=float(drop), test_images=len(test.labels), calibration=500)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
