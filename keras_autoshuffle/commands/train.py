"""Train a (Auto)ShuffleNet on CIFAR-10, Fashion-MNIST or the embedded digits, harden it,
export it.

    autoshuffle-train --dataset digits --output runs/digits
    autoshuffle-train --dataset cifar10 --data-dir ~/tensorflow_datasets \
        --model v2 --width 1.0 --shuffle auto --output runs/cifar10

Writes into --output: model.keras (hardened), saved_model/, model.tflite, report.json,
history.csv, logs/ (TensorBoard). A killed run started again with the same arguments
resumes from its last finished epoch. Recipes (epochs, learning rate, lambda, ...) are
`keras_autoshuffle.training.RECIPES`.
"""

import argparse


def main(argv=None):
    """Runs the `autoshuffle-train` command on `argv` (default: the command line)."""
    from keras_autoshuffle import training

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    training.add_arguments(parser, ("digits", "fashion_mnist", "cifar10"), "digits")
    args = parser.parse_args(argv)
    if args.width is None:
        args.width = 1.0 if args.dataset == "cifar10" else 0.5
    training.run_from_args(args, recipe_name=args.dataset, stem="cifar", parser=parser)
    return 0
