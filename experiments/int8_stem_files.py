"""What the stem convolution in float costs an int8 file: writes, for ShuffleNet v2 0.5x and
1.0x at 224 (folded, random weights: speed does not depend on their values), the ONNX and
OpenVINO int8 files full-integer and with the first convolution in float (`float_nodes`),
calibrated on 32 seeded random images; then `experiments.runtime_processes --files` times
each pair in fresh processes (Lab notes: inference, "What raises int8 agreement").

    python -m experiments.int8_stem_files runs/int8_stem
    python -m experiments.runtime_processes --runtime onnxruntime --processes 8 \
        --files full=runs/int8_stem/x1.0/full.onnx stem_float=runs/int8_stem/x1.0/stem_float.onnx
    python -m experiments.runtime_processes --runtime openvino --processes 8 \
        --files full=runs/int8_stem/x1.0/full_ov/model.xml \
        stem_float=runs/int8_stem/x1.0/stem_float_ov/model.xml
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WIDTHS = (0.5, 1.0)
SIDE = 224


def write(out):
    """The four int8 files of each width under `out`/x<width>/."""
    import numpy as np
    import onnx
    import openvino

    from keras_autoshuffle import applications, export, folding
    from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

    calibration = np.random.default_rng(0).normal(size=(32, SIDE, SIDE, 3)).astype("float32")
    for width in WIDTHS:
        folder = os.path.join(out, f"x{width}")
        net = applications.ShuffleNetV2(width=width, input_shape=(SIDE, SIDE, 3), classes=1000)
        files = export.export_model(
            folding.fold_model(net), folder, calibration[:1], formats=("onnx", "openvino")
        )
        onnx_path, ir_folder = files["onnx"]["path"], files["openvino"]["path"]
        first = next(n.name for n in onnx.load(onnx_path).graph.node if n.op_type == "Conv")
        ir = openvino.Core().read_model(os.path.join(ir_folder, OPENVINO_XML))
        ir_first = next(
            op.get_friendly_name()
            for op in ir.get_ordered_ops()
            if op.get_type_name() == "Convolution"
        )
        export.export_onnx_int8(onnx_path, os.path.join(folder, "full.onnx"), calibration)
        export.export_onnx_int8(
            onnx_path, os.path.join(folder, "stem_float.onnx"), calibration, float_nodes=[first]
        )
        export.export_openvino_int8(ir_folder, os.path.join(folder, "full_ov"), calibration)
        export.export_openvino_int8(
            ir_folder, os.path.join(folder, "stem_float_ov"), calibration, float_nodes=[ir_first]
        )
        print(width, first, ir_first, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m experiments.int8_stem_files OUTPUT_FOLDER")
    write(sys.argv[1])
