"""`autoshuffle-train`'s work: `main` trains, exports and reports. The command line
(`parser`, the options' help) is `keras_autoshuffle_cli.train`, which the installed command
runs first: `--help` without TensorFlow.
"""

import sys

from keras_autoshuffle_cli.train import DEFAULT_WIDTHS, parser


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
