"""The weights registry: torchvision's ImageNet ShuffleNetV2 checkpoints, the one source of
the published weights, and where their files are.

`CHECKPOINTS` holds one `Checkpoint` per width: its names, file, URL, hash and size, what
torchvision reports of it, its multiply-adds, its evaluation sizes and class names.
`CHECKPOINTS[1.0]` is the entry by width; `hub.list_presets()` is the one list of them (as
keras-hub's preset tables). An entry's name has two spellings, `entry.name`
(`shufflenet_v2_x1_0.imagenet`, torchvision's builder name) and `entry.preset`
(`shufflenet_v2_x1_0_imagenet`, keras-hub's: `from_preset`'s name); a builder's `weights=`
takes either. Also here: the download URL rule (`checkpoint_url`,
`$KERAS_AUTOSHUFFLE_WEIGHTS_URL`), Keras's cache folder (`cache_dir`), ImageNet's class
index and `decode_predictions`; `weights.pretrained` downloads, checks and converts the files.

Test seam: `CHECKPOINTS` is a plain dict {width: Checkpoint}, read at each call; a test may
replace an entry (e.g. `monkeypatch.setitem(CHECKPOINTS, 0.5, dataclasses.replace(
CHECKPOINTS[0.5], ...))`) to serve a small checkpoint of its own through the same download,
hash and conversion code, by width (`weights="imagenet"`) or by name (`weights=entry.name`).
"""

import dataclasses
import json
import os
import pathlib
import tempfile
import urllib.parse
from typing import Any

import keras
import numpy as np

from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD, width_name

BASE_URL = "https://download.pytorch.org/models/"
URL_VARIABLE = "KERAS_AUTOSHUFFLE_WEIGHTS_URL"
# The checkpoints and their converted files go to `<cache>/models` (`cache_dir`).
CACHE_SUBDIR = "models"
# Keras's ImageNet class index (keras.applications.imagenet_utils), the same file, URL
# and MD5, so both share one cached copy.
CLASS_INDEX_FILE = "imagenet_class_index.json"
CLASS_INDEX_URL = "https://storage.googleapis.com/download.tensorflow.org/data/" + CLASS_INDEX_FILE
CLASS_INDEX_MD5 = "c2c37ea517e94d9795004a39431a14cb"


def checkpoint_url(file_name: str) -> str:
    """`<base>/<file_name>`: the base is `$KERAS_AUTOSHUFFLE_WEIGHTS_URL` when set (an
    http(s):// or file:// URL of a folder, its query string kept, or an absolute folder
    path), else torchvision's."""
    base = os.environ.get(URL_VARIABLE, "").strip() or BASE_URL
    parts = urllib.parse.urlsplit(base)
    if not parts.scheme and os.path.isabs(base):
        parts = urllib.parse.urlsplit(pathlib.Path(base).as_uri())
    elif not _is_folder_url(parts):
        raise ValueError(
            f"The environment variable {URL_VARIABLE} must be the URL of a folder holding "
            "torchvision's checkpoint files (https://mirror/models/, file:///path/to/folder) "
            f"or an absolute folder path. Received: {URL_VARIABLE}={base!r}"
        )
    path = parts.path.rstrip("/") + "/" + urllib.parse.quote(file_name)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def _is_folder_url(parts):
    """Whether split URL `parts` can be a base: http(s)/ftp with a host, or file: with an
    absolute path (`file:relative/dir` has no meaning without a current folder)."""
    absolute = parts.path.startswith("/")
    if parts.scheme == "file":
        return absolute and parts.netloc in ("", "localhost")
    return (
        parts.scheme in ("http", "https", "ftp")
        and bool(parts.netloc)
        and (absolute or not parts.path)
    )


def cache_dir() -> str:
    """Keras's cache folder: `$KERAS_HOME` at the time of the call, else `~/.keras`
    (`/tmp/.keras` when that cannot be written, as `keras.utils.get_file` does)."""
    base = os.path.expanduser(
        os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    )
    try:
        os.makedirs(os.path.join(base, CACHE_SUBDIR), exist_ok=True)
    except OSError:
        base = None
    if base is None or not os.access(base, os.W_OK):
        base = os.path.join(tempfile.gettempdir(), ".keras")
        os.makedirs(os.path.join(base, CACHE_SUBDIR), exist_ok=True)
    return base


def imagenet_class_index(received: str) -> dict:
    """ImageNet's class index, `{"0": [wnid, name], ..., "999": [...]}`: Keras's
    `imagenet_class_index.json`, fetched once with `keras.utils.get_file` (MD5-checked)
    into Keras's cache folder (`cache_dir()`, read at each call).

    Args:
        received: what the caller was given, for the error's `Received: ...` ending.

    Returns:
        The index as a dict from the class number (a string) to `[wnid, name]`.

    Raises:
        OSError: the file is not in the cache and cannot be downloaded; the message says
            where to put it offline.
    """
    try:
        path = keras.utils.get_file(
            CLASS_INDEX_FILE,
            CLASS_INDEX_URL,
            cache_subdir=CACHE_SUBDIR,
            file_hash=CLASS_INDEX_MD5,
            cache_dir=cache_dir(),
        )
    except Exception as error:  # get_file raises a bare Exception on network errors
        where = os.path.join(cache_dir(), CACHE_SUBDIR, CLASS_INDEX_FILE)
        raise OSError(
            f"Could not get ImageNet's class names from {CLASS_INDEX_URL} ({type(error).__name__}"
            f": {error}). Offline: download it elsewhere and put it at {where}. "
            f"Received: {received}"
        ) from None
    with open(path) as handle:
        return json.load(handle)


def decode_predictions(preds: Any, top: int = 5) -> list[list[tuple[str, str, float]]]:
    """Decodes ImageNet predictions into (class id, class name, score), best first.

    The same results as `keras.applications.imagenet_utils.decode_predictions`, with
    the class index Keras uses (the synset order torchvision's classifiers share):
    `imagenet_class_index.json` is fetched once with `keras.utils.get_file`
    (MD5-checked) into Keras's cache, where Keras's own copy is found too. Not a call
    to Keras's: that one reads the cache folder fixed when Keras was imported and keeps
    the index in a module global; this one reads `$KERAS_HOME` at each call, says how
    to place the file offline, and refuses scores that are NaN or infinite (which
    would rank arbitrarily).

    Args:
        preds: scores of shape (samples, 1000): probabilities or logits, NumPy or tensor,
            all finite.
        top: how many classes per sample, an integer in [1, 1000] (Python or NumPy).

    Returns:
        A list with, per sample, a list of `top` tuples `(class_id, class_name, score)`,
            by decreasing score.
    """
    preds = np.asarray(keras.ops.convert_to_numpy(preds))
    if preds.ndim != 2 or preds.shape[1] != 1000:
        raise ValueError(
            "`preds` must be ImageNet scores of shape (samples, 1000). "
            f"Received: preds.shape={preds.shape}"
        )
    if not np.all(np.isfinite(preds)):
        sample, column = np.argwhere(~np.isfinite(preds))[0]
        raise ValueError(
            "`preds` must be finite scores; a NaN or infinite score has no rank (a diverged "
            f"model?). Received: preds[{sample}, {column}]={preds[sample, column]}"
        )
    integer = isinstance(top, (int, np.integer)) and not isinstance(top, (bool, np.bool_))
    if not integer or not 1 <= top <= 1000:
        raise ValueError(f"`top` must be an integer in [1, 1000]. Received: top={top!r}")
    top = int(top)
    index = imagenet_class_index(f"preds.shape={preds.shape}")
    results = []
    for row in preds:
        best = np.argsort(row)[::-1][:top]
        results.append([(*index[str(i)], row[i]) for i in best])
    return results


# torchvision's `Weights.meta["recipe"]` of each checkpoint.
PORTED_RECIPE = "https://github.com/ericsun99/Shufflenet-v2-Pytorch"
NEW_RECIPE = "https://github.com/pytorch/vision/pull/5906"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One published ShuffleNetV2 ImageNet checkpoint and what torchvision says of it:
    an entry of the weights registry (`applications.CHECKPOINTS[width]`).

    The fields are data a program can read (`to_dict()` gives them all, with `url`);
    `class_names()` is the classifier's classes, in its order;
    `applications.imagenet_preprocessing(width)` the evaluation transform.

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


# What `weights=` names for "the checkpoint of the model's width".
IMAGENET = "imagenet"


def named(name: object) -> Checkpoint | None:
    """The entry whose `name` or `preset` is `name`, or None."""
    if not isinstance(name, str):
        return None
    return next((e for e in CHECKPOINTS.values() if name in (e.name, e.preset)), None)


def names() -> list[str]:
    """The entries' names (`entry.name`), by width: what a builder's `weights=` takes."""
    return [CHECKPOINTS[width].name for width in sorted(CHECKPOINTS)]


def is_pretrained(weights: object) -> bool:
    """Whether a builder's `weights` asks for published weights: "imagenet" or an entry
    name, either spelling (which wins over a file of the same name)."""
    return isinstance(weights, str) and (weights == IMAGENET or named(weights) is not None)
