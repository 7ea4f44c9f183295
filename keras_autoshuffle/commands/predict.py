"""Classify images with an exported classifier, or with the pretrained ImageNet ShuffleNetV2.

MODEL is what `autoshuffle-finetune` wrote: `model.keras`, `model.tflite`,
`model_int8.tflite`, `model.onnx`, `model_int8.onnx`, the `openvino/` or `openvino_int8/`
folder, with `labels.txt` and
`preprocessing.json` beside it. IMAGE is a JPEG, PNG, BMP or GIF file, or a folder (its
images, not its subfolders). Prints each image's most probable classes, or with --json a
JSON list `[{"path", "top": [{"label", "probability"}]}]`. A refused input ends the
command with a one-line error and exit status 1 (2 for a wrong command line).
"""

import argparse
import sys

from keras_autoshuffle.commands._help import command_parser

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
    p.add_argument("--top", type=int, default=5, metavar="K", help="classes printed per image")
    p.add_argument("--json", action="store_true", help="print a JSON list for scripts")
    p.add_argument(
        "--skip-damaged",
        action="store_true",
        help="report an unreadable image and go on with the others (exit status 1 at the end)",
    )
    return p


def _format(results):
    """The human-readable blocks: the path, then `  0.93  cat` lines; paths, labels and
    errors escaped (`printable`: they come from users' files)."""
    from keras_autoshuffle._terminal import printable

    lines = []
    for result in results:
        lines.append(printable(result["path"]))
        if "error" in result:
            lines.append(f"  error: {printable(result['error'])}")
        lines += [
            f"  {t['probability']:.2f}  {printable(t['label'])}" for t in result.get("top", ())
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the `autoshuffle-predict` command.

    Args:
        argv: the arguments (default: the command line).

    Returns:
        0 when every image was classified; 1 when `--skip-damaged` skipped some.

    Raises:
        SystemExit: with a one-line message for a refused model, image or argument.
    """
    p = parser()
    args = p.parse_args(argv)
    if args.top < 1:
        p.error(f"--top must be a positive integer. Received: --top={args.top}")
    if args.imagenet is None and len(args.inputs) < 2:
        p.error(
            "give a MODEL and at least one IMAGE (or --imagenet WIDTH and images). "
            f"Received: {args.inputs}"
        )
    # The runtimes are imported only now (TensorFlow's start-up lines: `_startup`).
    import json

    from keras_autoshuffle import _startup, prediction
    from keras_autoshuffle._terminal import printable

    _startup.find_devices_quietly()  # before TensorFlow first looks for them, noisily

    imagenet = args.imagenet is not None
    images = args.inputs if imagenet else args.inputs[1:]
    try:
        files = prediction.image_paths(images)  # a mistyped path is named before any loading
        if imagenet:
            classifier = prediction.Classifier.imagenet(args.imagenet)
        else:
            classifier = prediction.Classifier.from_file(args.inputs[0])
        results = prediction.predict_files(classifier, files, args.top, args.skip_damaged)
    except (ValueError, OSError) as error:  # ImageFileError is a ValueError
        sys.exit(f"autoshuffle-predict: error: {printable(' '.join(str(error).split()))}")
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        print(_format(results))
    return 1 if any("error" in result for result in results) else 0
