"""Train a ShuffleNet on the embedded digits, Fashion-MNIST or CIFAR-10, then export it.

    autoshuffle-train --dataset digits --output runs/digits
    autoshuffle-train --dataset cifar10 --data-dir ~/tensorflow_datasets --download \
        --model v2 --width 1.0 --output runs/cifar10

The manual (ShuffleNet's) channel shuffle is the default; `--shuffle auto` trains
AutoShuffleNet's learned one instead and hardens it to an exact permutation (a study: it tied
or lost to the manual one in this project's runs). Writes into --output: model.keras,
saved_model/, model.tflite, report.json, history.csv, logs/ (TensorBoard). A killed run
started again with the same arguments resumes from its last finished epoch. Recipes
(epochs, learning rate, lambda, ...) are `keras_autoshuffle.training.RECIPES`.
"""

import argparse
import sys

from keras_autoshuffle.commands._help import command_parser

EXAMPLE = "autoshuffle-train --dataset digits --output runs/digits"
# The width when --width is not given: the recipes' (CIFAR-10's is the paper's 1.0).
DEFAULT_WIDTHS = {"digits": 0.5, "fashion_mnist": 0.5, "cifar10": 1.0}


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default and an example)."""
    from keras_autoshuffle.training import add_arguments

    description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2]
    p = command_parser("autoshuffle-train", description, EXAMPLE)
    return add_arguments(p, tuple(DEFAULT_WIDTHS), "digits")


def main(argv: list[str] | None = None) -> int:
    """Runs the `autoshuffle-train` command on `argv` (default: the command line); returns 0,
    or exits with status 2 and a one-line error on bad input."""
    p = parser()
    args = p.parse_args(argv)
    if args.width is None:
        args.width = DEFAULT_WIDTHS[args.dataset]
    from keras_autoshuffle import _startup, training

    _startup.find_devices_quietly()  # before TensorFlow first looks for them, noisily
    training.run_from_args(args, recipe_name=args.dataset, stem="cifar", parser=p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
