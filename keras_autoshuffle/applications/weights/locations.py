"""Where the published files are and what ImageNet's classes are called: the download URL
rule (`checkpoint_url`, `$KERAS_AUTOSHUFFLE_WEIGHTS_URL`), Keras's cache folder
(`cache_dir`), ImageNet's class index (`imagenet_class_index`) and `decode_predictions`.
The registry (`weights.registry`, which re-exports these names) points into them.
"""

import json
import os
import pathlib
import tempfile
import urllib.parse
from typing import Any

import keras
import numpy as np

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
