"""Text the commands print to a terminal: names and paths come from users' files and may hold
control characters (an ESC sequence clears the screen, recolours it or sets the window's
title), line breaks that fake output lines, or invisible and direction-changing characters
(U+202E) that make one name look like another. They are printed escaped, as `repr` shows
them."""


def printable(text: str) -> str:
    """`text` with every character `str.isprintable` refuses escaped as `repr` writes it.

    C0 and C1 controls (ESC, line breaks, U+0085), U+2028 and U+2029, format characters
    (zero-width spaces, bidirectional overrides) and spaces other than " " become `\\x1b`,
    `\\n`, `\\u202e`...; everything else, any script and emoji included, is kept.

    Args:
        text: what is about to be printed (one line: a line break is escaped too).

    Returns:
        The text, safe to print.

    Example:
        >>> printable("cat\\x1b[2J")
        'cat\\\\x1b[2J'
    """
    text = str(text)
    if text.isprintable():  # the common case, in one C loop
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
