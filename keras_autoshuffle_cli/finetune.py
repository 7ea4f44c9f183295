"""Fine-tune a pretrained ShuffleNet v2 on a folder of labelled images; export and report it.

    autoshuffle-finetune photos/ --output runs/photos
    autoshuffle-finetune photos/ --output runs/photos --width 0.5 --int8
    autoshuffle-finetune photos/ --output runs/photos --include-preprocessing
    autoshuffle-finetune more_photos/ --output runs/more --weights runs/photos/preset

`photos/` holds one subfolder per class (or train/ and val/, each with one per class).
Writes into --output: model.keras, labels.txt, preprocessing.json, model.tflite (and
model.onnx and openvino/ where installed; with --int8 model_int8.tflite, model_int8.onnx
and openvino_int8/ beside them), preset/ (a keras-hub preset: `from_preset`, or
--weights of a later run), report.md,
report.json, confusion_matrix.png; train_head/ and train_all/ hold each phase's
history.csv and TensorBoard logs. A killed run started again with the same arguments
resumes from its last finished epoch.
"""

import argparse
import sys
from collections.abc import Sequence

from keras_autoshuffle_cli._help import (
    add_int8_max_drop,
    add_int8_weight_bits,
    command_parser,
    positive_int_argument,
    run_command,
)

EXAMPLE = "autoshuffle-finetune photos/ --output runs/photos --width 0.5 --int8"


def _none_or_text(text):
    """--weights and --class-weights: "none" (any case) is None."""
    return None if text.lower() == "none" else text


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows every default)."""
    p = command_parser("autoshuffle-finetune", __doc__.split("\n\n")[0], EXAMPLE)
    p.add_argument("images", help="the image folder: one subfolder per class")
    p.add_argument("--output", required=True, help="the run's folder")
    p.add_argument(
        "--width", type=float, default=1.0, choices=(0.5, 1.0, 1.5, 2.0), help="network width"
    )
    p.add_argument(
        "--weights",
        type=_none_or_text,
        default="imagenet",
        help='"imagenet", a preset name (shufflenet_v2_x1_0_imagenet, ...) or folder (a '
        'run\'s preset/), the path of a .keras ShuffleNet v2 of --width, or "none"',
    )
    p.add_argument("--image-size", type=positive_int_argument, default=224, help="input side")
    p.add_argument(
        "--epochs", type=positive_int_argument, default=10, help="epochs of the whole net"
    )
    p.add_argument(
        "--head-epochs",
        type=int,
        default=None,
        help="epochs of the head alone first (default: 3 with pretrained weights, else 0)",
    )
    p.add_argument("--batch-size", type=positive_int_argument, default=32, help="images a step")
    p.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="the whole net's initial rate (default: 0.01 pretrained, 0.1 from scratch); "
        "the head's is 10x",
    )
    p.add_argument("--label-smoothing", type=float, default=0.1, help="in [0, 1)")
    p.add_argument(
        "--class-weights",
        type=_none_or_text,
        default="balanced",
        help='"balanced" (weigh classes by their image counts) or "none"',
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="share of each class held out, without train/ and val/ subfolders",
    )
    p.add_argument("--split-seed", type=int, default=0, help="seed of that split")
    p.add_argument("--no-flip", action="store_true", help="no horizontal flips (text, digits, ...)")
    p.add_argument("--seed", type=int, default=0, help="seed of the head, data order, crops")
    p.add_argument(
        "--export-formats",
        nargs="+",
        default=None,
        choices=("litert", "onnx", "openvino", "none"),
        help="files to export besides model.keras (default: litert, and onnx and openvino "
        'where installed; "none": model.keras only)',
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="also a full-integer file of each export (model_int8.tflite, model_int8.onnx, "
        "openvino_int8/), each checked against the float model on the validation images",
    )
    add_int8_max_drop(p, "validation")
    add_int8_weight_bits(p)
    p.add_argument(
        "--include-preprocessing",
        action="store_true",
        help="exported files take raw uint8 RGB pixels of any size (resize, crop, normalise "
        "inside); not with --int8",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="decode every image every epoch instead of once into OUTPUT/image_cache/",
    )
    p.add_argument(
        "--skip-damaged", action="store_true", help="skip damaged images (counted) instead"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a finished run")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Keras's verbose")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `autoshuffle-finetune`: parses `argv` (default: the command line), so
    `--help` and a usage error answer before TensorFlow loads, then runs
    `keras_autoshuffle.commands.finetune.main(argv)`."""
    parse_args(argv)
    return run_command("finetune", argv)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`parser()`'s arguments from `argv`, and what the options contradict (argparse checks
    each alone) ended as argparse's own errors: usage, `error: ...`, status 2."""
    p = parser()
    args = p.parse_args(argv)
    if args.int8_max_drop is not None and not args.int8:
        p.error(f"argument --int8-max-drop: needs --int8, got {args.int8_max_drop:g}")
    if args.int8_weight_bits is not None and not args.int8:
        p.error(f"argument --int8-weight-bits: needs --int8, got {args.int8_weight_bits}")
    return args


if __name__ == "__main__":
    sys.exit(main())
