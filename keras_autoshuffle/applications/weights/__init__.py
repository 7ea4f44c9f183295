"""The published weights and the files behind a builder's `weights=`, in four modules:

- `registry`: torchvision's ImageNet ShuffleNetV2 checkpoints as data (`CHECKPOINTS`, one
  `Checkpoint` per width: names, URL, hash, accuracy, evaluation transform, class names),
  the download URL rule, the cache folder, the class index, `decode_predictions`;
- `download` and `pretrained`: `weights="imagenet"` (download, hash check, conversion,
  cache) and what a Keras weights file says of the net it fits;
- `torch_checkpoint`: PyTorch's `.pth` files read with NumPy alone, running no code from
  them (standard library and NumPy only: a script can load it by path);
- `torchvision`: torchvision's ShuffleNetV2 state dict mapped onto this package's layers.

The public names are `keras_autoshuffle.applications`'.
"""
