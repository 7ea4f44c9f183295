"""The `autoshuffle-train-imagenet` command (keras_autoshuffle/commands/train_imagenet.py),
runnable from a checkout:

    python scripts/train_imagenet.py --data-dir DIR --manual-dir ARCHIVES --output runs/in
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

from keras_autoshuffle.commands.train_imagenet import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
