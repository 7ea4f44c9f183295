"""What the commands' `--help` looks like: one formatter, one way to make a parser."""

import argparse
from typing import NoReturn


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
        from keras_autoshuffle._terminal import printable

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
