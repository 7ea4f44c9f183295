"""The command lines of keras-autoshuffle's installed commands, read without TensorFlow.

`[project.scripts]` in pyproject.toml points at these modules' `main`: each parses its
command's arguments first, so `--help` and a usage error answer at once (tens of
milliseconds, no Keras or TensorFlow imported), then runs the command's work,
`keras_autoshuffle.commands.<name>.main`, which imports the package and with it Keras and
TensorFlow (seconds, 800 MB). A package beside `keras_autoshuffle` rather than inside it:
importing `keras_autoshuffle` imports Keras, as it registers every custom object (so
`.keras` files load with `safe_mode=True`), and a module inside it cannot be imported
without its package. This one imports nothing but the standard library.

One module per command, each with `parser()` (its options, every one with a help text and
its default shown) and `main(argv=None)`: `finetune`, `predict`, `train`, `train_imagenet`,
`convert_weights`.
"""
