"""The package's shell commands' work (`[project.scripts]` in pyproject.toml), one module
each: `finetune`, `predict`, `train`, `train_imagenet`, `convert_weights`.

Each command's parser is `keras_autoshuffle_cli.<name>.parser()`, outside this package so
that `--help` imports no TensorFlow. The installed command parses there first, then calls
this module's `main(argv=None)`, which parses again, imports what the work needs and
returns 0 (1 from `autoshuffle-predict` when it skipped a damaged image); a refusal ends
in SystemExit with the reason.
"""
