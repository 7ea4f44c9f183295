"""The data sets by name: `load(name)` looks the loader up in `LOADERS`."""

import os

from keras_autoshuffle.data import sources
from keras_autoshuffle.data.pipeline import EpochData

# name -> loader(seed, data_dir=, manual_dir=, download=) -> (train, test). Each passes on
# only the options its source takes (the digits are embedded; only ImageNet has manual
# archives; only CIFAR-10 may download). `sources.X` is looked up per call, so a patched
# `sources.X` takes effect.
LOADERS = {
    "digits": lambda seed, **_: sources.digits(seed),
    "fashion_mnist": lambda seed, data_dir, **_: sources.fashion_mnist(seed, data_dir),
    "cifar10": lambda seed, data_dir, download, **_: sources.cifar10(seed, data_dir, download),
    "imagenet2012": lambda seed, data_dir, manual_dir, **_: sources.imagenet(
        seed, data_dir, manual_dir
    ),
}
"""{data set name: loader(seed, data_dir=, manual_dir=, download=) -> (train, test)}."""
# Written out, not `tuple(LOADERS)`, so the API reference shows the names.
DATASETS = ("digits", "fashion_mnist", "cifar10", "imagenet2012")
"""The data set names `load` takes (the keys of `LOADERS`, in order)."""


def load(
    name: str,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    manual_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> tuple[EpochData, EpochData]:
    """`(train, test)` EpochData for `name` in DATASETS."""
    if name not in LOADERS:
        raise ValueError(f"`dataset` must be one of {DATASETS}. Received: dataset={name!r}")
    return LOADERS[name](seed, data_dir=data_dir, manual_dir=manual_dir, download=download)
