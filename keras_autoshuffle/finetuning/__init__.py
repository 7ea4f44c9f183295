"""Fine-tuning: a pretrained ShuffleNet v2 trained on a folder of your labelled images,
exported for phones (LiteRT, int8), ONNX Runtime and OpenVINO, and reported:
`finetune()` (`run`, on the command line `autoshuffle-finetune`), its argument checks
(`arguments`), the two phases (`phases`, `network`), the run's folder (`run_folder`), the
files measured and reported (`evaluation`, `metrics`, `report`), and the exported network
with its preprocessing inside (`raw_inputs`).
"""

from keras_autoshuffle.finetuning.raw_inputs import (
    RAW_INPUT_FORMATS,
    RawImagePreprocessing,
    raw_input_model,
)
from keras_autoshuffle.finetuning.run import finetune

__all__ = ["RAW_INPUT_FORMATS", "RawImagePreprocessing", "finetune", "raw_input_model"]
