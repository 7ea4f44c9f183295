"""The `autoshuffle-train` command (keras_autoshuffle/commands/train.py), runnable from a
checkout:

    python scripts/train_cifar10.py --dataset digits --output runs/digits
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

from keras_autoshuffle.commands.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
