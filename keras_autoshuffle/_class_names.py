"""The one rule for a class name (standard library only: the hub and export modules use it
without importing TensorFlow's data pipeline)."""

import unicodedata
from collections.abc import Iterable

# Characters a class name may not hold: it is one line of labels.txt (every character
# `str.splitlines` splits on), and it is printed (controls: ESC sequences clear or recolour
# a terminal; bidirectional overrides show it reversed). Zero-width joiners stay allowed:
# emoji sequences and some scripts need them.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def class_name_problem(name: str) -> str | None:
    """Why `name` cannot name a class (a line of labels.txt, printed), or None."""
    if not name.strip():
        return "is blank (labels.txt cannot hold a blank class name)"
    for character in name:
        if character in LINE_BREAKS:
            return f"holds a line break ({ascii(character)}): labels.txt holds one name a line"
        if unicodedata.category(character) == "Cc":
            return f"holds a control character ({ascii(character)})"
        if character in BIDI_CONTROLS:
            return f"holds a text-direction control ({ascii(character)})"
        if character == "\ufeff":  # read_labels drops one at the start of labels.txt
            return "holds a byte-order mark ('\\ufeff')"
    return None


def check_class_names(names: Iterable[str], count: int, argument: str, outputs: str) -> list[str]:
    """`names` as a list of class names (`class_name_problem`), one per output of what has
    `count` outputs (`outputs` says what, in the error); ValueError naming `argument`."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise ValueError(
            f"`{argument}` must be a list of class names (strings). "
            f"Received: {argument}={names!r:.80}"
        )
    names = list(names)
    if len(names) != count:
        raise ValueError(
            f"`{argument}` must name each of the {count} outputs {outputs}. "
            f"Received: {len(names)} {argument}"
        )
    for name in names:
        problem = class_name_problem(name)
        if problem:
            raise ValueError(
                f"`{argument}` must be class names: {name!r} {problem}. Received: {name!r}"
            )
    return names
