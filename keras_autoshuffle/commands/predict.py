"""Classify images with an exported classifier, or with the pretrained ImageNet ShuffleNetV2.

MODEL is what `autoshuffle-finetune` wrote: `model.keras`, `model.tflite`,
`model_int8.tflite`, `model.onnx` or the `openvino/` folder, with `labels.txt` and
`preprocessing.json` beside it. IMAGE is a JPEG, PNG, BMP or GIF file, or a folder (its
images, not its subfolders). Prints each image's most probable classes, or with --json a
JSON list `[{"path", "top": [{"label", "probability"}]}]`. A refused input ends the
command with a one-line error and exit status 1 (2 for a wrong command line).
"""

import argparse
import os
import sys

EPILOG = """examples:
  autoshuffle-predict runs/pets/model.tflite photos/cat.jpg photos/dogs/
  autoshuffle-predict runs/pets/openvino --top 3 --json photos/ > predictions.json
  autoshuffle-predict --imagenet 1.0 photos/cat.jpg
"""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, the examples kept as written."""


def _parser():
    parser = argparse.ArgumentParser(
        prog="autoshuffle-predict",
        usage="%(prog)s [options] (MODEL | --imagenet WIDTH) IMAGE [IMAGE ...]",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="PATH",
        help="the model (not with --imagenet), then image files or folders",
    )
    parser.add_argument(
        "--imagenet",
        type=float,
        metavar="WIDTH",
        help="use torchvision's pretrained ImageNet ShuffleNetV2 of this width "
        "(0.5, 1.0, 1.5, 2.0; downloaded once) instead of a MODEL",
    )
    parser.add_argument("--top", type=int, default=5, metavar="K", help="classes printed per image")
    parser.add_argument("--json", action="store_true", help="print a JSON list for scripts")
    parser.add_argument(
        "--skip-damaged",
        action="store_true",
        help="report an unreadable image and go on with the others (exit status 1 at the end)",
    )
    return parser


def _format(results):
    """The human-readable blocks: the path, then `  0.93  cat` lines."""
    lines = []
    for result in results:
        lines.append(result["path"])
        if "error" in result:
            lines.append(f"  error: {result['error']}")
        lines += [f"  {t['probability']:.2f}  {t['label']}" for t in result.get("top", ())]
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
    parser = _parser()
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be a positive integer. Received: --top={args.top}")
    if args.imagenet is None and len(args.inputs) < 2:
        parser.error(
            "give a MODEL and at least one IMAGE (or --imagenet WIDTH and images). "
            f"Received: {args.inputs}"
        )
    # The runtimes are imported only now. TensorFlow's C++ logs are quieted for the imports
    # that follow (the package's own `import keras`, before this module, has loaded it).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import json

    from keras_autoshuffle import prediction

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
        sys.exit(f"autoshuffle-predict: error: {' '.join(str(error).split())}")
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        print(_format(results))
    return 1 if any("error" in result for result in results) else 0
