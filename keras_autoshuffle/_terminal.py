"""Text the commands print to a terminal, escaped: `printable`, defined with the commands'
command lines (`keras_autoshuffle_cli._terminal`), which escape their usage errors without
importing this package."""

from keras_autoshuffle_cli._terminal import printable  # noqa: F401
