"""Train a ShuffleNet on ImageNet (ILSVRC 2012) with the paper's two-cycle recipe.

    autoshuffle-train-imagenet --data-dir ~/tensorflow_datasets \
        --manual-dir ~/imagenet_archives --model v2 --width 1.0 --output runs/imagenet

ImageNet cannot be downloaded automatically: put ILSVRC2012_img_train.tar and
ILSVRC2012_img_val.tar (from image-net.org) in --manual-dir; TFDS prepares them once.
The recipe: two cycles of 100 epochs (--epochs sets each), lr 0.2 then 0.1 decaying
linearly, the second cycle continuing from the first one's weights; momentum 0.9, weight
decay 4e-5, lambda 2e-3 (learned shuffles), global batch 512. The manual shuffle is the
default (`--shuffle auto`: the learned one). Outputs as `autoshuffle-train`'s.
Across hosts: set TF_CONFIG on every host and pass --strategy multi-worker.
"""

import argparse
import sys
from collections.abc import Sequence

from keras_autoshuffle_cli._help import command_parser, run_command
from keras_autoshuffle_cli.train import add_arguments

EXAMPLE = (
    "autoshuffle-train-imagenet --data-dir ~/tensorflow_datasets "
    "--manual-dir ~/imagenet_archives --output runs/imagenet"
)


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default and an example)."""
    description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2]
    p = command_parser("autoshuffle-train-imagenet", description, EXAMPLE)
    add_arguments(p, ("imagenet2012",), "imagenet2012")
    p.add_argument(
        "--manual-dir",
        default=None,
        help="folder with ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (default: "
        "TFDS's downloads/manual folder under --data-dir)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `autoshuffle-train-imagenet`: parses `argv` (default: the command line),
    so `--help` and a usage error answer before TensorFlow loads, then runs
    `keras_autoshuffle.commands.train_imagenet.main(argv)`."""
    parser().parse_args(argv)
    return run_command("train_imagenet", argv)


if __name__ == "__main__":
    sys.exit(main())
