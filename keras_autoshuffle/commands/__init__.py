"""The package's shell commands (`[project.scripts]` in pyproject.toml), one module each:

- `autoshuffle-train` (`train`): train, harden and export a (Auto)ShuffleNet on the
  embedded digits, Fashion-MNIST or CIFAR-10;
- `autoshuffle-train-imagenet` (`train_imagenet`): the same on ImageNet (ILSVRC 2012);
- `autoshuffle-convert-weights` (`convert_weights`): a torchvision ShuffleNetV2
  checkpoint (`.pth`) to a Keras weights file, without torch.

Each module's `main(argv=None)` parses `argv` (default: the command line) and returns 0;
a refusal ends in SystemExit with the reason. The repository's wrapper scripts call the same
functions.
"""
