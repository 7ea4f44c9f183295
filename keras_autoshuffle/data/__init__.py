"""Input pipelines: TFDS CIFAR-10 and ImageNet, Fashion-MNIST IDX files, embedded digits,
folders of labelled images, each split an `EpochData` whose epoch is a pure function of
`(seed, epoch)` (`pipeline`). One loader per data set (`sources`, `registry.load`); one
untrusted image file checked and decoded upright (`images`, `exif`); a folder of labelled
images scanned, split and recorded (`image_folder*`), cached decoded (`image_cache`).
Everything is re-exported here: `from keras_autoshuffle import data; data.digits()`.
"""

from keras_autoshuffle.data.image_folder import ImageFolderData, image_folder
from keras_autoshuffle.data.image_folder_scan import scan_image_folder
from keras_autoshuffle.data.image_folder_split import ImageFolderError, ImageFolderSplit
from keras_autoshuffle.data.images import (
    IMAGE_EXTENSIONS,
    MAX_FILE_BYTES,
    MAX_PIXELS,
    ImageFileError,
    check_image_file,
    decode_rgb,
    has_image_extension,
    read_image,
)
from keras_autoshuffle.data.pipeline import (
    ArrayData,
    EpochCounter,
    EpochData,
    TFDSData,
    epoch_permutation,
    example_seed,
)
from keras_autoshuffle.data.registry import DATASETS, LOADERS, load
from keras_autoshuffle.data.sources import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    FASHION_MNIST_DEBIAN_DIR,
    FASHION_MNIST_FILES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    DataMissingError,
    cifar10,
    digits,
    fashion_mnist,
    imagenet,
    load_digits,
    load_fashion_mnist,
    prepared_builder,
    read_idx,
)
from keras_autoshuffle.data.transforms import (
    normalize,
    pad_crop_flip,
    random_resized_crop,
    resize_center_crop,
)

__all__ = [
    "ArrayData",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DATASETS",
    "DataMissingError",
    "EpochCounter",
    "EpochData",
    "FASHION_MNIST_DEBIAN_DIR",
    "FASHION_MNIST_FILES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "ImageFileError",
    "ImageFolderData",
    "ImageFolderError",
    "ImageFolderSplit",
    "LOADERS",
    "MAX_FILE_BYTES",
    "MAX_PIXELS",
    "TFDSData",
    "check_image_file",
    "cifar10",
    "decode_rgb",
    "digits",
    "epoch_permutation",
    "example_seed",
    "fashion_mnist",
    "has_image_extension",
    "image_folder",
    "imagenet",
    "load",
    "load_digits",
    "load_fashion_mnist",
    "normalize",
    "pad_crop_flip",
    "prepared_builder",
    "random_resized_crop",
    "read_idx",
    "read_image",
    "resize_center_crop",
    "scan_image_folder",
]
