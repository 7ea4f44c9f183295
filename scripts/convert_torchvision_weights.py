"""The `autoshuffle-convert-weights` command (keras_autoshuffle/commands/convert_weights.py),
runnable from a checkout:

    python scripts/convert_torchvision_weights.py shufflenetv2_x1-5666bf0f80.pth x1_0.weights.h5
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

from keras_autoshuffle.commands.convert_weights import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
