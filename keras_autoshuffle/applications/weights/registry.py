"""The weights registry: torchvision's ImageNet ShuffleNetV2 checkpoints, the one source of
the published weights.

`CHECKPOINTS` holds one `Checkpoint` per width: its names, file, URL, hash and size, what
torchvision reports of it, its multiply-adds, its evaluation sizes and class names.
Everything else is a view of it: `list_weights()` is the one list of names; an entry has
two spellings of one name, `entry.name` (`shufflenet_v2_x1_0.imagenet`, torchvision's
builder name; what a builder takes as `weights=`) and `entry.preset`
(`shufflenet_v2_x1_0_imagenet`, keras-hub's spelling: `from_preset`'s name), and
`get_weights` and `weights=` take either; `CHECKPOINTS[1.0]` is the entry by width;
`hub.list_presets()` is the same entries as keras-hub's preset tables. Where the files
are (`checkpoint_url`, `cache_dir`) and ImageNet's class index are `weights.locations`'s,
re-exported here; `weights.pretrained` downloads, checks and converts the files.

Example:
    >>> from keras_autoshuffle import applications
    >>> applications.list_weights()
    ['shufflenet_v2_x0_5.imagenet', 'shufflenet_v2_x1_0.imagenet', ...]
    >>> entry = applications.get_weights("shufflenet_v2_x1_0_imagenet")
    >>> entry.name, entry.acc1, entry.num_params
    ('shufflenet_v2_x1_0.imagenet', 69.362, 2278604)
    >>> model = applications.ShuffleNetV2(1.0, weights=entry.name)

Test seam: `CHECKPOINTS` is a plain dict {width: Checkpoint}, read at each call; a test may
replace an entry (e.g. `monkeypatch.setitem(CHECKPOINTS, 0.5, dataclasses.replace(
CHECKPOINTS[0.5], ...))`) to serve a small checkpoint of its own through the same download,
hash and conversion code, by width (`weights="imagenet"`) or by name (`weights=entry.name`).
"""

import dataclasses
import warnings

import keras

from keras_autoshuffle import _validation
from keras_autoshuffle.applications import preprocessing
from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD, width_name
from keras_autoshuffle.applications.weights.locations import (  # noqa: F401 (re-exported)
    BASE_URL,
    CACHE_SUBDIR,
    CLASS_INDEX_FILE,
    CLASS_INDEX_MD5,
    CLASS_INDEX_URL,
    URL_VARIABLE,
    cache_dir,
    checkpoint_url,
    decode_predictions,
    imagenet_class_index,
)

# torchvision's `Weights.meta["recipe"]` of each checkpoint.
PORTED_RECIPE = "https://github.com/ericsun99/Shufflenet-v2-Pytorch"
NEW_RECIPE = "https://github.com/pytorch/vision/pull/5906"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One published ShuffleNetV2 ImageNet checkpoint and what torchvision says of it:
    an entry of the weights registry (`applications.get_weights(name)`).

    The fields are data a program can read (`to_dict()` gives them all, with `url`);
    `class_names()` is the classifier's classes, in its order;
    `imagenet_preprocessing(width)` the evaluation transform.

    Attributes:
        file_name: the file's name (the download URL's last part).
        sha256: the file's SHA-256 in hex: all 64 digits where a full hash is published,
            else the prefix torchvision puts in the file name, which is what
            `torch.hub.load_state_dict_from_url(check_hash=True)` checks too. The
            download must start with it.
        num_params: trainable parameters with the 1000-class classifier (torchvision's
            `meta["num_params"]`; BatchNorm's moving statistics not counted).
        acc1: ImageNet-1K validation top-1 accuracy (%) that torchvision reports.
        acc5: the same, top-5.
        resize_size: the side torchvision's evaluation transform (`ImageClassification`)
            resizes the shorter side to (bilinear), before the crop.
        crop_size: the side of its center crop, after which `preprocess_input` scales to
            [0, 1] and normalises with `mean` / `std`.
        classes: the classifier's class count.
        mean: the normalisation's mean, per RGB channel.
        std: its standard deviation, per RGB channel.
        name: the registry name, `<model>_<width>.<dataset>` (`shufflenet_v2_x1_0.imagenet`),
            what builders take as `weights=`.
        builder: the builder whose network the weights are (`"ShuffleNetV2"`; the
            learned-shuffle `"AutoShuffleNetV2"` loads them too, its shuffles starting at
            the manual one).
        width: the builder's `width` the weights fit.
        file_size: the file's size in bytes. Exact for x1.0 (OpenVINO's model zoo); for the
            others torchvision's `meta["_file_size"]` (MiB, 3 decimals) times 2**20, so
            within 525 bytes; informative only (the hash is what is checked).
        macs: multiply-adds per 224x224 image, as `count_macs` counts them (torchvision's
            `meta["_ops"]` is the same in GFLOPs, rounded).
        torchvision_name: the torchvision weights enum member that is this file.
        recipe: how the weights were trained (torchvision's `meta["recipe"]`).
        dataset: the dataset the accuracy is measured on.
    """

    file_name: str
    sha256: str
    num_params: int
    acc1: float
    acc5: float
    resize_size: int = 256
    crop_size: int = 224
    classes: int = 1000
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    # Keyword-only: the fields above keep their positions.
    _: dataclasses.KW_ONLY
    name: str
    builder: str
    width: float
    file_size: int
    macs: int
    torchvision_name: str
    recipe: str = PORTED_RECIPE
    dataset: str = "ImageNet-1K"

    @property
    def url(self) -> str:
        """Where the file is downloaded from (`KERAS_AUTOSHUFFLE_WEIGHTS_URL` applied)."""
        return checkpoint_url(self.file_name)

    @property
    def preset(self) -> str:
        """The same name as keras-hub spells a preset: `shufflenet_v2_x1_0_imagenet`."""
        return self.name.replace(".", "_")

    @property
    def stem(self) -> str:
        """The file name without `.pth`: the converted files are named after it."""
        return self.file_name.removesuffix(".pth")

    @property
    def metrics(self) -> dict[str, dict[str, float]]:
        """The reported accuracy as torchvision's `meta["_metrics"]`:
        `{"ImageNet-1K": {"acc@1": ..., "acc@5": ...}}` (%)."""
        return {self.dataset: {"acc@1": self.acc1, "acc@5": self.acc5}}

    def preprocessing(self, data_format: str | None = None) -> keras.Sequential:
        """Deprecated alias of `applications.imagenet_preprocessing(self.width)`; the
        preset's `ShuffleNetImageConverter` is the one spelling."""
        warnings.warn(
            "Checkpoint.preprocessing() is deprecated: use keras_autoshuffle.hub."
            "ShuffleNetImageConverter (or applications.imagenet_preprocessing(width)).",
            DeprecationWarning,
            stacklevel=2,
        )
        return _preprocessing_of(self, data_format)

    def class_names(self) -> list[str]:
        """The classifier's class names, in its output order (1000 ImageNet-1K classes):
        the class index `decode_predictions` uses (Keras's `imagenet_class_index.json`,
        fetched once, MD5-checked, into Keras's cache).

        Returns:
            A list of `classes` names, output `i`'s name at index `i`.

        Raises:
            OSError: the class index is not cached and cannot be downloaded (the message
                says where to put it offline).
        """
        index = imagenet_class_index(f"weights={self.name!r}")
        return [index[str(i)][1] for i in range(self.classes)]

    def to_dict(self) -> dict:
        """Every field, plus `url` and `metrics`, as JSON-ready values (tuples as lists).

        Returns:
            A dict from field name to value.
        """
        data = dataclasses.asdict(self)
        data.update(url=self.url, metrics=self.metrics)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def _entry(width, file_name, sha256, num_params, acc1, acc5, file_size, macs, **kwargs):
    """The registry entry of torchvision's ShuffleNetV2 checkpoint at `width`."""
    suffix = width_name(width)  # "x1_0", torchvision's builder suffix
    return Checkpoint(
        file_name,
        sha256,
        num_params,
        acc1,
        acc5,
        name=f"shufflenet_v2_{suffix}.imagenet",
        builder="ShuffleNetV2",
        width=width,
        file_size=file_size,
        macs=macs,
        torchvision_name=f"ShuffleNet_V2_{suffix.upper()}_Weights.IMAGENET1K_V1",
        **kwargs,
    )


# torchvision 0.2x `ShuffleNet_V2_X*_Weights.IMAGENET1K_V1` (torchvision/models/
# shufflenetv2.py): URL, num_params, acc@1 / acc@5, transforms, _file_size (MiB). x0.5 and
# x1.0 were ported from ericsun99/Shufflenet-v2-Pytorch (legacy torch format, resize 256);
# x1.5 and x2.0 were trained with torchvision's new recipe (resize 232). Only the x1.0
# file's full SHA-256 and byte size were found published (OpenVINO Open Model Zoo,
# models/public/shufflenet-v2-x1.0/model.yml: 9,218,294 bytes; its hash starts with
# torchvision's prefix); for the other three the prefix in torchvision's file name is all
# that is checked. The multiply-adds are `count_macs` of the built net at 224x224
# (tests/test_weights_registry.py recomputes them).
CHECKPOINTS = {
    0.5: _entry(
        0.5,
        "shufflenetv2_x0.5-f707e7126e.pth",
        "f707e7126e",
        1_366_792,
        60.552,
        81.746,
        file_size=round(5.282 * 2**20),
        macs=40_476_448,
    ),
    1.0: _entry(
        1.0,
        "shufflenetv2_x1-5666bf0f80.pth",
        "5666bf0f80d1e7f8fb61f6a65742b9c27c37f3208c1f087cdcd7c1ec1aa8b848",
        2_278_604,
        69.362,
        88.316,
        file_size=9_218_294,
        macs=144_907_992,
    ),
    1.5: _entry(
        1.5,
        "shufflenetv2_x1_5-3c479a10.pth",
        "3c479a10",
        3_503_624,
        72.996,
        91.086,
        file_size=round(13.557 * 2**20),
        macs=295_759_392,
        resize_size=232,
        recipe=NEW_RECIPE,
    ),
    2.0: _entry(
        2.0,
        "shufflenetv2_x2_0-8be3c8ee.pth",
        "8be3c8ee",
        7_393_996,
        76.230,
        93.006,
        file_size=round(28.433 * 2**20),
        macs=583_253_464,
        resize_size=232,
        recipe=NEW_RECIPE,
    ),
}


# The public builders and the network family each builds (a checkpoint's `builder` is the
# manual-shuffle builder of its family; the learned-shuffle one loads its weights too).
MODELS = {
    "ShuffleNetV1": "ShuffleNetV1",
    "ShuffleNetV2": "ShuffleNetV2",
    "AutoShuffleNetV1": "ShuffleNetV1",
    "AutoShuffleNetV2": "ShuffleNetV2",
}
# What `weights=` names for "the checkpoint of the model's width".
IMAGENET = "imagenet"


def list_models(pretrained: bool = False) -> list[str]:
    """The builders of `applications`, by name (as timm's `list_models`).

    Args:
        pretrained: only the builders that published weights exist for
            (`list_weights(model)` is not empty).

    Returns:
        The builder names, sorted (e.g. `"ShuffleNetV2"`: `applications.ShuffleNetV2`).
    """
    if not isinstance(pretrained, bool):
        raise ValueError(f"`pretrained` must be True or False. Received: pretrained={pretrained!r}")
    names = sorted(MODELS)
    return [name for name in names if list_weights(name)] if pretrained else names


def list_weights(model: str | None = None) -> list[str]:
    """The names of the published weights (`weights=` of a builder), by width.

    Args:
        model: a builder name (`list_models()`) to list only the weights it loads, or None
            for all.

    Returns:
        The entry names, e.g. `["shufflenet_v2_x0_5.imagenet", ...]`; empty for a builder
            with none (ShuffleNet v1).

    Raises:
        ValueError: `model` is not a builder name.
    """
    if model is not None and model not in MODELS:
        raise ValueError(
            f"`model` must be None or a builder name, one of {sorted(MODELS)}. "
            f"Received: model={model!r}"
        )
    entries = [CHECKPOINTS[width] for width in sorted(CHECKPOINTS)]
    return [e.name for e in entries if model is None or e.builder == MODELS[model]]


def get_weights(name: str) -> Checkpoint:
    """The registry entry of the published weights `name`.

    Args:
        name: an entry name of `list_weights()`, e.g. `"shufflenet_v2_x1_0.imagenet"`, or
            its preset spelling (`entry.preset`, `"shufflenet_v2_x1_0_imagenet"`).

    Returns:
        Its `Checkpoint`: URL, SHA-256, file name and size, class count and names, the
            evaluation sizes, accuracy (`metrics`), parameter count and multiply-adds.

    Raises:
        ValueError: no entry has that name; the message lists the names.
    """
    entry = _named(name)
    if entry is None:
        raise ValueError(
            f"No published weights are named {name!r}. The names are {list_weights()} "
            f"(`applications.list_weights()`), or the same with '_' for '.'. "
            f"Received: name={name!r}"
        )
    return entry


def _named(name):
    """The entry named `name` (either spelling), or None."""
    found = [
        e for e in CHECKPOINTS.values() if isinstance(name, str) and name in (e.name, e.preset)
    ]
    return found[0] if found else None


def is_pretrained(weights: object) -> bool:
    """Whether a builder's `weights` asks for published weights: "imagenet" or an entry
    name, either spelling (which wins over a file of the same name)."""
    return isinstance(weights, str) and (weights == IMAGENET or _named(weights) is not None)


def imagenet_preprocessing(width: float = 1.0, data_format: str | None = None) -> keras.Sequential:
    """torchvision's evaluation transform for the ImageNet weights of `ShuffleNetV2(width)`
    (the checkpoint's resize and crop sizes, ImageNet's normalisation), as a
    `keras.Sequential`: `evaluation_preprocessing`'s layers and limits, named after the
    checkpoint; the same transform as its preset's `hub.ShuffleNetImageConverter`.

    Args:
        width: a key of `applications.CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        A `keras.Sequential` from pixel values in [0, 255], a batch of any size
            (batch, height, width, channels), to the model's input (batch, 224, 224, 3).

    Example:
        >>> preprocess = applications.imagenet_preprocessing(1.0)
        >>> model = applications.ShuffleNetV2(1.0, weights="imagenet")
        >>> batch = data.read_image("cat.jpg")[None]
        >>> applications.decode_predictions(model.predict(preprocess(batch)), top=3)
    """
    entry = CHECKPOINTS[_validation.choice(width, tuple(CHECKPOINTS), "width")]
    return _preprocessing_of(entry, data_format)


def _preprocessing_of(entry, data_format):
    scale, offset = preprocessing.scale_offset(entry.mean, entry.std)
    layers = preprocessing.evaluation_layers(
        entry.crop_size, entry.resize_size, scale, offset, data_format
    )
    return preprocessing.as_sequential(
        layers, f"shufflenet_v2_{width_name(entry.width)}_preprocessing"
    )
