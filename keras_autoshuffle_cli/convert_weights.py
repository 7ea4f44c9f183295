"""Convert a torchvision ShuffleNetV2 checkpoint (`.pth`) into a Keras weights file.

Reads the checkpoint with torch where it is installed, else with
`keras_autoshuffle.applications.read_torch_checkpoint` (no torch needed; both of PyTorch's
formats). The width and the class count are read from the checkpoint; the Keras net is
`ShuffleNetV2(width, stem="imagenet", classes=...)`, whose logits equal torchvision's
(max difference 1e-5 to 5e-5 measured at 224x224 and 225x225 for every width).

Usage:
    autoshuffle-convert-weights shufflenetv2_x1-5666bf0f80.pth shufflenet_v2_x1_0.weights.h5

`--no-top` leaves the classifier out (for `include_top=False`, to fine-tune a new head).
The output is written atomically (under a temporary name in its folder, then moved into
place): an interrupted conversion leaves the old file or none, never half a file. Every
refusal (a damaged checkpoint, a classifier of no classes, an output in a missing folder
or that is a folder) ends the command with a message naming the file and the value.
Then, in Keras (manual shuffles, or learned ones starting at the manual shuffle):
    ShuffleNetV2(1.0, stem="imagenet", weights="shufflenet_v2_x1_0.weights.h5")
    AutoShuffleNetV2(1.0, stem="imagenet", weights="shufflenet_v2_x1_0.weights.h5",
                     shuffle_initializer="manual")
"""

import argparse
import sys
from collections.abc import Sequence

from keras_autoshuffle_cli._help import command_parser, run_command

EXAMPLE = "autoshuffle-convert-weights shufflenetv2_x1-5666bf0f80.pth x1_0.weights.h5"


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows an example)."""
    p = command_parser("autoshuffle-convert-weights", __doc__.split("\n\n")[0], EXAMPLE)
    p.add_argument("checkpoint", help="torchvision ShuffleNetV2 checkpoint (.pth)")
    p.add_argument("output", help="Keras weights file to write (.weights.h5)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument(
        "--no-top", action="store_true", help="leave the classifier out (include_top=False)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `autoshuffle-convert-weights`: parses `argv` (default: the command
    line), so `--help` and a usage error answer before TensorFlow loads, then runs
    `keras_autoshuffle.commands.convert_weights.main(argv)`."""
    parser().parse_args(argv)
    return run_command("convert_weights", argv)


if __name__ == "__main__":
    sys.exit(main())
