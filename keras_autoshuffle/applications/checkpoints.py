"""torchvision's ImageNet ShuffleNetV2 checkpoints: the registry `CHECKPOINTS` (data only:
where each file is, its hash, what torchvision reports of it) and the download URL rule.
`pretrained` downloads, checks and converts them; `preprocessing` reads their sizes.

Test seam: `CHECKPOINTS` is a plain dict {width: Checkpoint}; a test may replace an entry
(e.g. `monkeypatch.setitem(CHECKPOINTS, 0.5, Checkpoint(...))`) to serve a small
checkpoint of its own through the same download, hash and conversion code.
"""

import dataclasses
import os
import pathlib
import urllib.parse

from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD

BASE_URL = "https://download.pytorch.org/models/"
URL_VARIABLE = "KERAS_AUTOSHUFFLE_WEIGHTS_URL"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One published ShuffleNetV2 ImageNet checkpoint and what torchvision says of it.

    Attributes:
        file_name: the file's name (the download URL's last part).
        sha256: the file's SHA-256 in hex: all 64 digits where a full hash is published,
            else the prefix torchvision puts in the file name, which is what
            `torch.hub.load_state_dict_from_url(check_hash=True)` checks too. The
            download must start with it.
        num_params: trainable parameters with the 1000-class classifier.
        acc1, acc5: ImageNet-1K validation accuracy (%) that torchvision reports.
        resize_size, crop_size: torchvision's evaluation transform
            (`ImageClassification`): resize the shorter side to `resize_size`
            (bilinear), center-crop `crop_size`, then `preprocess_input` (scale to [0, 1],
            normalise with `mean` / `std`); `imagenet_preprocessing(width)` is this
            transform as Keras layers.
        classes: the classifier's class count.
        mean, std: the normalisation, per RGB channel.
    """

    file_name: str
    sha256: str
    num_params: int
    acc1: float
    acc5: float
    resize_size: int = 256
    crop_size: int = 224
    classes: int = 1000
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD

    @property
    def url(self):
        """Where the file is downloaded from (`KERAS_AUTOSHUFFLE_WEIGHTS_URL` applied)."""
        return checkpoint_url(self.file_name)

    @property
    def stem(self):
        """The file name without `.pth`: the converted files are named after it."""
        return self.file_name.removesuffix(".pth")


# torchvision 0.2x `ShuffleNet_V2_X*_Weights.IMAGENET1K_V1` (torchvision/models/
# shufflenetv2.py): URL, num_params, acc@1 / acc@5, transforms. x0.5 and x1.0 were ported
# from ericsun99/Shufflenet-v2-Pytorch (legacy torch format, resize 256); x1.5 and x2.0
# were trained with torchvision's new recipe (resize 232). Only the x1.0 file's full
# SHA-256 was found published (OpenVINO Open Model Zoo, models/public/
# shufflenet-v2-x1.0/model.yml: 9,218,294 bytes; it starts with torchvision's prefix);
# for the other three the prefix in torchvision's file name is all that is checked.
CHECKPOINTS = {
    0.5: Checkpoint("shufflenetv2_x0.5-f707e7126e.pth", "f707e7126e", 1_366_792, 60.552, 81.746),
    1.0: Checkpoint(
        "shufflenetv2_x1-5666bf0f80.pth",
        "5666bf0f80d1e7f8fb61f6a65742b9c27c37f3208c1f087cdcd7c1ec1aa8b848",
        2_278_604,
        69.362,
        88.316,
    ),
    1.5: Checkpoint(
        "shufflenetv2_x1_5-3c479a10.pth", "3c479a10", 3_503_624, 72.996, 91.086, resize_size=232
    ),
    2.0: Checkpoint(
        "shufflenetv2_x2_0-8be3c8ee.pth", "8be3c8ee", 7_393_996, 76.230, 93.006, resize_size=232
    ),
}


def checkpoint_url(file_name):
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
