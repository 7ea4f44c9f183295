"""Export to `.keras`, SavedModel, LiteRT, ONNX and OpenVINO, each reloaded and checked
against Keras.

A model whose shuffles are still relaxed is refused unless asked for: its shuffles
are dense N x N matrices, not the permutations the paper ships. Harden first
(`harden_model` / `HardenShuffles`) and, for speed, fold the permutations into the
weights (`keras_autoshuffle.folding.fold_model`).

Every file is written under a temporary name and moved into place (`_atomic`): a killed
export leaves the previous file or the new one, never a truncated one.

`quantize="int8"` adds a full-integer file of each float LiteRT, ONNX and OpenVINO file
(`model_int8.tflite`, `model_int8.onnx`, `openvino_int8/`) calibrated on
`representative_data`, whose check is its accuracy drop from the float model's on labelled
test data, within `max_accuracy_drop` points (`export_int8`, `int8_runtimes`).

- `export_model`, the one call: checks, files, parity check, int8 (`pipeline.py`);
- what is checked before anything is written (`checks.py`);
- each format's writer and reader (`files.py`);
- the one place that runs an exported file in any runtime, with its input description,
  class names and size (`runner.py`: `open_runner`; `litert_interpreter`);
- the files' metadata, the class names and the input's normalisation, that MediaPipe Tasks
  reads in a `.tflite` file, in ONNX `metadata_props` and OpenVINO `rt_info` (`metadata.py`:
  `describe_*`, `read_*_metadata`);
- the int8 LiteRT file and the int8 check (`int8.py`); the int8 ONNX and OpenVINO files
  (`int8_runtimes.py`);
- ONNX and OpenVINO files, loaded in ONNX Runtime and OpenVINO (`onnx_runtimes.py`), written
  from the net's layers as an NCHW graph (`onnx_graph.py`).
"""

from keras_autoshuffle.export.checks import (
    check_exportable,
    check_formats,
    compute_dtypes,
    is_installed,
    make_folder,
    unsupported_formats,
    unsupported_int8,
)
from keras_autoshuffle.export.files import (
    DEFAULT_FORMATS,
    FILENAMES,
    FORMATS,
    INT8_FILENAME,
    INT8_FILES,
    export_litert,
    export_saved_model,
    keras_outputs,
    save_keras,
    saved_model_outputs,
    size_bytes,
)
from keras_autoshuffle.export.int8 import (
    MAX_ACCURACY_DROP,
    MIN_CALIBRATION_IMAGES,
    Int8CheckError,
    export_int8,
    int8_check,
)
from keras_autoshuffle.export.int8_runtimes import export_onnx_int8, export_openvino_int8
from keras_autoshuffle.export.metadata import (
    describe_litert,
    describe_onnx,
    describe_openvino,
    read_litert_metadata,
    read_onnx_metadata,
    read_openvino_metadata,
    with_input_normalization,
)
from keras_autoshuffle.export.onnx_graph import onnx_graph, unsupported_layers
from keras_autoshuffle.export.onnx_runtimes import (
    OPENVINO_PRECISION,
    OPENVINO_PRECISIONS,
    export_onnx,
    export_openvino,
    onnx_session,
    openvino_config,
    openvino_model,
)
from keras_autoshuffle.export.pipeline import (
    QUANTIZE,
    export_model,
)
from keras_autoshuffle.export.runner import (
    InputDescription,
    Runner,
    litert_interpreter,
    open_runner,
)

__all__ = [
    "DEFAULT_FORMATS",
    "FILENAMES",
    "FORMATS",
    "INT8_FILENAME",
    "INT8_FILES",
    "MAX_ACCURACY_DROP",
    "MIN_CALIBRATION_IMAGES",
    "OPENVINO_PRECISION",
    "OPENVINO_PRECISIONS",
    "QUANTIZE",
    "InputDescription",
    "Int8CheckError",
    "Runner",
    "check_exportable",
    "check_formats",
    "compute_dtypes",
    "describe_litert",
    "describe_onnx",
    "describe_openvino",
    "export_int8",
    "export_litert",
    "export_model",
    "export_onnx",
    "export_onnx_int8",
    "export_openvino",
    "export_openvino_int8",
    "export_saved_model",
    "int8_check",
    "keras_outputs",
    "litert_interpreter",
    "make_folder",
    "onnx_graph",
    "onnx_session",
    "openvino_config",
    "openvino_model",
    "open_runner",
    "read_litert_metadata",
    "read_onnx_metadata",
    "read_openvino_metadata",
    "save_keras",
    "saved_model_outputs",
    "size_bytes",
    "unsupported_formats",
    "unsupported_int8",
    "unsupported_layers",
    "with_input_normalization",
]
