"""Classify images with an exported classifier, or with the pretrained ImageNet ShuffleNetV2.

MODEL is what `autoshuffle-finetune` wrote: `model.keras`, `model.tflite`,
`model_int8.tflite`, `model.onnx`, `model_int8.onnx`, the `openvino/` or `openvino_int8/`
folder (an exported file's metadata names its classes and normalisation; `labels.txt` and
`preprocessing.json` beside it are read where present), or a keras-hub preset folder.
IMAGE is a JPEG, PNG, BMP or GIF file, or a folder (its images, not its subfolders).
Prints each image's most probable classes, or with --json a JSON list `[{"path", "top":
[{"label", "probability"}]}]`. A refused input ends the command with a one-line error and
exit status 1 (2 for a wrong command line).
"""

import argparse
import sys
from collections.abc import Sequence

from keras_autoshuffle_cli._help import command_parser, positive_int_argument, run_command

EXAMPLE = "autoshuffle-predict runs/photos/model.tflite photos/cat.jpg photos/dogs/ --top 3"


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default and an example)."""
    p = command_parser("autoshuffle-predict", __doc__.split("\n\n")[0], EXAMPLE)
    p.usage = "%(prog)s [options] (MODEL | --imagenet WIDTH) IMAGE [IMAGE ...]"
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="PATH",
        help="the model (not with --imagenet), then image files or folders",
    )
    p.add_argument(
        "--imagenet",
        type=float,
        metavar="WIDTH",
        help="use torchvision's pretrained ImageNet ShuffleNetV2 of this width "
        "(0.5, 1.0, 1.5, 2.0; downloaded once) instead of a MODEL (default: a MODEL)",
    )
    p.add_argument(
        "--top", type=positive_int_argument, default=5, metavar="K", help="classes per image"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list for scripts")
    p.add_argument(
        "--skip-damaged",
        action="store_true",
        help="report an unreadable image and go on with the others (exit status 1 at the end)",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`argv` (default: the command line) parsed and checked; a usage error ends the program
    as argparse's own do (usage, `error: ...`, status 2)."""
    p = parser()
    args = p.parse_args(argv)
    if args.imagenet is None and len(args.inputs) < 2:
        p.error(
            "give a MODEL and at least one IMAGE (or --imagenet WIDTH and images). "
            f"Received: {args.inputs}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `autoshuffle-predict`: parses `argv` (default: the command line), so
    `--help` and a usage error answer before TensorFlow loads, then runs
    `keras_autoshuffle.commands.predict.main(argv)`."""
    parse_args(argv)
    return run_command("predict", argv)


if __name__ == "__main__":
    sys.exit(main())
