"""What the commands' command lines share: one help formatter, one way to make a parser,
the count type, and the hand-over to the command's work."""

import argparse
import importlib
import math
from collections.abc import Callable, Sequence
from typing import NoReturn

from keras_autoshuffle_cli._terminal import printable


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default appended as "(default: ...)", the description and the example
    kept as written. A default of None or a flag's False is not shown: "(default: None)" says
    nothing, so such an option's help text says what happens without it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _CommandParser(argparse.ArgumentParser):
    """argparse's parser whose error messages are escaped (`printable`): its "unrecognized
    arguments" and the commands' own `p.error` calls quote the command line raw."""

    def error(self, message: str) -> NoReturn:
        super().error(printable(message))


def command_parser(prog: str, description: str, example: str) -> argparse.ArgumentParser:
    """An argument parser for command `prog`: `description` on top, defaults shown, and
    `example` (one command line) in the epilog."""
    return _CommandParser(
        prog=prog,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=HelpFormatter,
    )


def number_argument(
    kind: type, accept: Callable[[float], bool], wanted: str
) -> Callable[[str], float]:
    """An argparse `type=`: `kind(text)` where `accept` holds, else a usage error that says
    what is `wanted` and quotes the text (NaN and inf refused where `accept` refuses them)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value + 0  # -0.0 as 0.0

    return parse


# The command lines' counts, and --int8-max-drop as `_validation.percentage_points` checks it.
positive_int_argument = number_argument(int, lambda v: v >= 1, "a positive integer")
percentage_points_argument = number_argument(
    float, lambda v: 0 <= v <= 100, "a number of percentage points in [0, 100]"
)


def add_int8_max_drop(parser: argparse.ArgumentParser, held_out: str) -> None:
    """Adds `--int8-max-drop POINTS` (the int8 policy's bound) to `parser`; `held_out` names
    the images the drop is measured on ("validation", "test")."""
    parser.add_argument(
        "--int8-max-drop",
        type=percentage_points_argument,
        default=None,  # export.MAX_ACCURACY_DROP, written in the help: --help imports nothing
        metavar="POINTS",
        help=f"with --int8: an int8 file is written when its {held_out} accuracy is at most "
        "this many percentage points below the float model's, else refused (default: 2; "
        "100: always written); its drop and top-1 agreement are reported either way",
    )


def add_int8_weight_bits(parser: argparse.ArgumentParser) -> None:
    """Adds `--int8-weight-bits {7,8}` (the ONNX and OpenVINO int8 files' weight bits,
    `export_model(int8_weight_bits=)`) to `parser`."""
    parser.add_argument(
        "--int8-weight-bits",
        type=int,
        choices=(7, 8),
        default=None,  # int8_runtimes.DEFAULT_WEIGHT_BITS, written in the help
        help="with --int8: the weights' bits in the ONNX and OpenVINO int8 files (LiteRT's are "
        "always 8). 7 (default): right on every x86 CPU. 8: a little closer to the float "
        "model, but only for files that will run on CPUs with VNNI (AVX-512 VNNI, AVX-VNNI): "
        "elsewhere the int8 kernels' 16-bit sums saturate and the file loses accuracy "
        "(measured: 1.2 points of agreement in OpenVINO) that the check, run on this CPU, "
        "cannot see",
    )


def run_command(name: str, argv: Sequence[str] | None) -> int:
    """Runs `keras_autoshuffle.commands.<name>.main(argv)`, the command's work, imported only
    now: the arguments were parsed without Keras (it parses them again, in microseconds)."""
    return importlib.import_module(f"keras_autoshuffle.commands.{name}").main(argv)
