"""Fine-tuning: a pretrained ShuffleNet v2 trained on a folder of your labelled images,
exported for phones (LiteRT, int8), ONNX Runtime and OpenVINO, and reported.

- `run.py`: `finetune()`: the run from the scan to the report, its exports;
- `arguments.py`: the checks of its arguments and folders, before any work;
- `phases.py`: the two-phase recipe, each phase a `training.train()` run;
- `run_folder.py`: the files a run writes, and what a failed, finished or replaced run
  leaves;
- `network.py`: the network with its new head, the starting weights, what each phase
  freezes;
- `evaluation.py`: each exported file measured on the validation images;
- `raw_inputs.py`: the exported network with its preprocessing inside, for raw pixels of
  any size;
- `metrics.py`: the validation metrics, the confusion matrix, each file's latency;
- `report.py`: `report.json` and `report.md`.

The `autoshuffle-finetune` command is `finetune()` on the command line.
"""

from keras_autoshuffle.finetuning.raw_inputs import (
    RawImagePreprocessing,
    raw_input_formats,
    raw_input_model,
)
from keras_autoshuffle.finetuning.run import finetune

__all__ = ["RawImagePreprocessing", "finetune", "raw_input_formats", "raw_input_model"]
