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

from keras_autoshuffle.commands._help import command_parser

EXAMPLE = (
    "autoshuffle-train-imagenet --data-dir ~/tensorflow_datasets "
    "--manual-dir ~/imagenet_archives --output runs/imagenet"
)


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default and an example)."""
    from keras_autoshuffle.training import add_arguments

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


def main(argv: list[str] | None = None) -> int:
    """Runs the `autoshuffle-train-imagenet` command on `argv` (default: the command line);
    returns 0, or exits with status 2 and a one-line error on bad input."""
    p = parser()
    args = p.parse_args(argv)
    if args.width is None:
        args.width = 1.0
    from keras_autoshuffle import _startup, training

    _startup.find_devices_quietly()  # before TensorFlow first looks for them, noisily
    training.run_from_args(
        args, recipe_name="imagenet", stem="imagenet", manual_dir=args.manual_dir, parser=p
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
