"""The package's shell commands' work (`[project.scripts]` in pyproject.toml), one module each:

- `autoshuffle-finetune` (`finetune`): a pretrained ShuffleNet v2 fine-tuned on a folder of
  labelled images, exported and reported;
- `autoshuffle-predict` (`predict`): the top classes of images, with any file
  `autoshuffle-finetune` wrote or the pretrained ImageNet nets;
- `autoshuffle-train` (`train`): train and export a ShuffleNet (the manual shuffle unless
  `--shuffle auto`) on the embedded digits, Fashion-MNIST or CIFAR-10;
- `autoshuffle-train-imagenet` (`train_imagenet`): the same on ImageNet (ILSVRC 2012);
- `autoshuffle-convert-weights` (`convert_weights`): a torchvision ShuffleNetV2
  checkpoint (`.pth`) to a Keras weights file, without torch.

Each command's argument parser is `keras_autoshuffle_cli.<name>.parser()` (every option with
a help text, the defaults shown, one example in the epilog; re-exported here as `parser`),
outside this package so that `--help` imports no TensorFlow. The installed command parses
there first, then calls this module's `main(argv=None)`, which parses `argv` (default: the
command line) again, imports what the work needs, and returns 0 (1 from
`autoshuffle-predict` when it skipped a damaged image); a refusal ends in SystemExit with
the reason. TensorFlow's start-up lines are kept off the screen (`keras_autoshuffle._startup`).
"""
