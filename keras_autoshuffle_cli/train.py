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
import math
import sys
from collections.abc import Sequence

from keras_autoshuffle_cli._help import (
    add_int8_max_drop,
    add_int8_weight_bits,
    command_parser,
    number_argument,
    positive_int_argument,
    run_command,
)

EXAMPLE = "autoshuffle-train --dataset digits --output runs/digits"
# The width when --width is not given: the recipes' (CIFAR-10's is the paper's 1.0).
DEFAULT_WIDTHS = {"digits": 0.5, "fashion_mnist": 0.5, "cifar10": 1.0}
# `--strategy`'s choices (`keras_autoshuffle.training.make_strategy` makes them).
STRATEGIES = ("auto", "one-device", "mirrored", "multi-worker")


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default and an example)."""
    description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2]
    p = command_parser("autoshuffle-train", description, EXAMPLE)
    return add_arguments(p, tuple(DEFAULT_WIDTHS), "digits")


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `autoshuffle-train`: parses `argv` (default: the command line), so
    `--help` and a usage error answer before TensorFlow loads, then runs
    `keras_autoshuffle.commands.train.main(argv)`."""
    parser().parse_args(argv)
    return run_command("train", argv)


# The options shared with `autoshuffle-train-imagenet`, and their types. A few types check
# with the package's own limits, imported only when the option is given.


def _sinkhorn_iterations(text):
    from keras_autoshuffle.constraints import check_iterations

    try:
        return check_iterations(positive_int_argument(text), "sinkhorn_iterations")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_seed = number_argument(int, lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1]")
_non_negative_int = number_argument(int, lambda v: v >= 0, "an integer >= 0")
_non_negative_float = number_argument(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")
_positive_float = number_argument(float, lambda v: 0 < v < math.inf, "a finite number > 0")


def _export_formats(text):
    from keras_autoshuffle.export import FORMATS

    formats = tuple(f.strip() for f in text.split(","))
    if not all(f in FORMATS for f in formats):
        raise argparse.ArgumentTypeError(
            f"must be formats of {','.join(FORMATS)} separated by commas, got {text!r}"
        )
    return formats


class _FormatsAction(argparse.Action):
    """`--export-formats onnx openvino` or `onnx,openvino`: one flat tuple of formats."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(f for group in values for f in group))


def _penalty(text):
    from keras_autoshuffle._validation import MAX_PENALTY

    value = _non_negative_float(text)
    if value > MAX_PENALTY:  # lambda x P(M) would overflow the loss
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PENALTY:g}, got {text!r}")
    return value


def add_arguments(
    parser: argparse.ArgumentParser, datasets: Sequence[str], default_dataset: str
) -> argparse.ArgumentParser:
    """The command-line options shared by the training commands."""
    _add_network_arguments(parser, datasets, default_dataset)
    _add_training_arguments(parser)
    _add_run_arguments(parser)
    return parser


def _add_network_arguments(parser, datasets, default_dataset):
    """The data, the network and its shuffles."""
    parser.add_argument("--dataset", choices=datasets, default=default_dataset, help="data set")
    parser.add_argument("--model", choices=("v1", "v2"), default="v2", help="ShuffleNet version")
    parser.add_argument(
        "--width",
        type=float,
        default=None,
        help="width multiplier (default: 1.0 on cifar10 and imagenet2012, 0.5 on digits and "
        "fashion_mnist)",
    )
    parser.add_argument(
        "--groups", type=positive_int_argument, default=3, help="group count of ShuffleNet v1"
    )
    parser.add_argument(
        "--shuffle",
        choices=("manual", "auto"),
        default="manual",
        help="the channel shuffle: ShuffleNet's fixed one (manual, recommended) or "
        "AutoShuffleNet's learned one (auto, a study: it tied or lost in this project's runs)",
    )
    parser.add_argument(
        "--padding",
        choices=("torch", "same"),
        default="torch",
        help="stride-2 padding: PyTorch's (torchvision-compatible) or Keras's 'same' (no PAD "
        "ops in LiteRT)",
    )
    parser.add_argument(
        "--sinkhorn-iterations",
        type=_sinkhorn_iterations,
        default=10,
        help="constraint passes per step of each learned shuffle (1: the paper's Algorithm 1, "
        "which stalled short of permutations in docs/training.md's runs; 10 ended on them); "
        "--shuffle auto only",
    )
    parser.add_argument(
        "--shuffle-initializer",
        choices=("random", "manual"),
        default="random",
        help="where learned shuffles start: the paper's random matrix or the manual shuffle; "
        "--shuffle auto only",
    )
    parser.add_argument(
        "--shuffle-forward",
        choices=("relaxed", "hard"),
        default="relaxed",
        help="learned shuffles compute M x (relaxed) or the nearest permutation of M, with a "
        "straight-through gradient (hard); --shuffle auto only",
    )


def _add_training_arguments(parser):
    """The search, the recipe's overrides, how the steps run, the data's origin."""
    parser.add_argument(
        "--search-epochs",
        type=_non_negative_int,
        default=None,
        help="search, then retrain: learn the shuffles this many epochs (0: harden the fresh "
        "net's matrices; with --balanced, balanced hardening), then train the net with them "
        "fixed from fresh weights for the whole recipe (default: no search; --shuffle auto "
        "only)",
    )
    parser.add_argument(
        "--penalty",
        "--lambda",
        dest="penalty",
        type=_penalty,
        default=None,
        help="lambda, the weight of the learned shuffles' l1-2 penalty (default: the "
        "--dataset recipe's)",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int_argument,
        default=None,
        help="epochs (per cycle; default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int_argument,
        default=None,
        help="global batch, over all replicas (default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=None,
        help="the first cycle's initial learning rate (default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="distribution strategy (auto: multi-worker when TF_CONFIG lists several "
        "workers, mirrored over several local GPUs, else one device)",
    )
    parser.add_argument("--mixed-precision", action="store_true", help="fp16 GPU / bf16 CPU")
    parser.add_argument("--jit-compile", action="store_true", help="XLA (slower on CPU)")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="TFDS data directory (default: TFDS's, ~/tensorflow_datasets; Fashion-MNIST is "
        "also looked for in Debian's folder)",
    )
    parser.add_argument(
        "--download",
        action="store_true",
        help="download and prepare CIFAR-10 into --data-dir when it is missing there",
    )


def _add_run_arguments(parser):
    """The output, the seed, the exports, the hardening, what is shown."""
    parser.add_argument(
        "--output", required=True, help="the run's folder (created; a killed run resumes there)"
    )
    parser.add_argument(
        "--seed", type=_seed, default=0, help="seed of the weights, data order and augmentation"
    )
    parser.add_argument(
        "--max-train-examples",
        type=positive_int_argument,
        default=None,
        help="use only the first N training examples (default: all)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a finished run in --output"
    )
    parser.add_argument(
        "--no-export", action="store_true", help="write model.keras only: no SavedModel, LiteRT"
    )
    parser.add_argument(
        "--export-formats",
        type=_export_formats,
        nargs="+",
        action=_FormatsAction,
        default=None,
        help="export exactly these formats (e.g. saved_model,litert or onnx openvino), "
        "refusing before training any this backend, precision or install cannot write (onnx, "
        "openvino: pip install 'keras-autoshuffle[onnx,openvino]'; default: SavedModel and "
        "LiteRT where possible, the others left out with a warning)",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="also write full-integer files of the folded net (float32 in and out): "
        "model_int8.tflite, and model_int8.onnx / openvino_int8/ with ONNX / OpenVINO exports "
        "(OpenVINO's: pip install 'keras-autoshuffle[openvino-int8]'), calibrated on training "
        "images, each written when its test accuracy is within --int8-max-drop of the float "
        "model's",
    )
    add_int8_max_drop(parser, "test")
    add_int8_weight_bits(parser)
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="balanced hardening: permutations that fold as cheaply as the manual shuffle "
        "(--shuffle auto only)",
    )
    parser.add_argument(
        "--harden-at-epoch",
        type=positive_int_argument,
        default=None,
        help="harden after this many epochs and fine-tune the rest (default: at the end)",
    )
    parser.add_argument(
        "--verbose",
        type=int,
        default=1,
        choices=(0, 1, 2),
        help="Keras's verbose: 0 silent, 1 progress bar, 2 one line per epoch",
    )


if __name__ == "__main__":
    sys.exit(main())
