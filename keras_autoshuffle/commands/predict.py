"""`autoshuffle-predict`'s work: `main` classifies the images and prints their top classes.
The command line (`parser`, `parse_args`, the options' help) is `keras_autoshuffle_cli.predict`,
which the installed command runs first: `--help` without TensorFlow.
"""

import sys

from keras_autoshuffle_cli.predict import parse_args, parser  # noqa: F401 (parser: its API)


def _format(results):
    """The human-readable blocks: the path, then `  0.93  cat` lines; paths, labels and
    errors escaped (`printable`: they come from users' files)."""
    from keras_autoshuffle_cli._terminal import printable

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
    args = parse_args(argv)
    # The runtimes are imported only now (TensorFlow's start-up lines: `_startup`).
    import json

    from keras_autoshuffle import _startup, _validation, prediction
    from keras_autoshuffle_cli._terminal import printable

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
        sys.exit(f"autoshuffle-predict: error: {printable(_validation.one_line(error))}")
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        print(_format(results))
    return 1 if any("error" in result for result in results) else 0
