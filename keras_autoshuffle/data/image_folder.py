"""A folder of labelled images, for fine-tuning: scanned and checked before any training,
split once and recorded, read as `EpochData`.

Layouts (as `keras.utils.image_dataset_from_directory` reads them):

- `root/<class>/...`: one folder per class, split per class with a seeded generator
  (`source="split"`);
- `root/train/<class>/...` and `root/val/<class>/...` (or `validation/`): the split is the
  folders' (`source="folders"`).

Images in nested folders of a class folder count; files without an image extension
(`IMAGE_EXTENSIONS`, any case) are ignored, as Keras does, and so are hidden files and
folders (names starting with "."). Class names are sorted as Keras sorts them. Symbolic
links to folders are followed, each folder once. Every image is checked with
`check_image_file`: a damaged file is refused before training starts (or skipped and
recorded, with `skip_damaged=True`).

`image_folder(root, record=path)` saves the split it scans and, when the record exists,
reads the same images again: a resumed or repeated run trains on the same split.
"""

import concurrent.futures
import dataclasses
import json
import os
import unicodedata
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_autoshuffle import _atomic, _validation, applications
from keras_autoshuffle._class_names import class_name_problem
from keras_autoshuffle._resize_crop import MAX_ASPECT_RATIO
from keras_autoshuffle.applications.preprocessing import evaluation_sizes
from keras_autoshuffle.data import transforms
from keras_autoshuffle.data.image_cache import build_image_cache, read_cached
from keras_autoshuffle.data.images import (
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    ImageFileError,
    check_image_file,
    decode_rgb,
    has_image_extension,
)
from keras_autoshuffle.data.pipeline import EpochData, epoch_permutation

# Training decodes a JPEG at 1/2, 1/4 or 1/8 scale when its shorter side stays at least
# TRAINING_DECODE_FACTOR * image_size (`decode_rgb(contents, min_side)`). Why 2: the
# photos the ImageNet weights were trained on are mostly about 500 x 375 (a shorter side
# ~1.7 x 224), so a random-resized crop (8% to 100% of the area) keeps at least the
# pixels it had there, and a full-area crop is still shrunk 2x or more by the resize.
# The DCT scaling averages blocks, where `tf.image.resize` (bilinear, not antialiased)
# skips pixels: a 4000 x 3000 photo's full-area crop is shrunk 3 to 4.5x (from
# 1000 x 750) instead of 13 to 18x, less aliased. Measured on 2 loaded cores
# (experiments/finetune_throughput.py, docs/results/finetune_throughput.json): training
# epochs of 4000 x 3000 photos 1.9x faster (1/4 scale), of 1600 x 1200 ones no faster
# (1/2 scale: the entropy decoding, which scaling does not shorten, dominates).
TRAINING_DECODE_FACTOR = 2
# Files and folders a scan visits at most: a wrong root (a home folder, a disk) is refused
# instead of being walked for hours.
MAX_FILES = 10_000_000
MAX_RECORD_BYTES = 2**30
SPLIT_FORMAT = "keras_autoshuffle.image_folder_split"
SPLIT_VERSION = 1
VAL_FOLDERS = ("val", "validation")
SOURCES = ("folders", "split")


class ImageFolderError(ValueError):
    """A folder of images, or a split record, that cannot be used: the message names the
    path or field, the problem and what to do."""


def _error(problem, advice, name, value):
    text = repr(value)
    if len(text) > 300:  # a whole list of a record
        text = text[:300] + "..."
    return ImageFolderError(f"{problem}. {advice} Received: {name}={text}")


@dataclasses.dataclass(frozen=True)
class ImageFolderSplit:
    """The images of a folder, split into training and validation examples.

    Attributes:
        root: the folder; the paths below are relative to it.
        class_names: the class folders' names, sorted; a label indexes them.
        train: the training examples, (path relative to `root` with "/" separators, label).
        val: the validation examples, likewise.
        source: "folders" (the `train/` and `val/` folders) or "split" (a seeded split of
            each class).
        val_fraction: the fraction of each class split off for validation ("split").
        split_seed: the seed of that split.
        skipped: damaged files skipped (`skip_damaged=True`): (relative path, problem).
        ignored: files without an image extension, or hidden, that were ignored.
    """

    root: str
    class_names: tuple[str, ...]
    train: tuple[tuple[str, int], ...]
    val: tuple[tuple[str, int], ...]
    source: str
    val_fraction: float
    split_seed: int
    skipped: tuple[tuple[str, str], ...] = ()
    ignored: int = 0

    @property
    def train_labels(self) -> np.ndarray:
        """The training examples' labels, int32 (for class weights)."""
        return np.array([label for _, label in self.train], dtype=np.int32)

    def to_json(self) -> dict:
        """The split as JSON values (what `save` writes).

        Returns:
            A dict of lists, strings and numbers.
        """
        return {
            "format": SPLIT_FORMAT,
            "version": SPLIT_VERSION,
            "root": self.root,
            "class_names": list(self.class_names),
            "train": [list(example) for example in self.train],
            "val": [list(example) for example in self.val],
            "source": self.source,
            "val_fraction": self.val_fraction,
            "split_seed": self.split_seed,
            "skipped": [list(item) for item in self.skipped],
            "ignored": self.ignored,
        }

    @classmethod
    def from_json(cls, data: dict, root: str | os.PathLike) -> "ImageFolderSplit":
        """The split `to_json` gave, checked field by field (a record may be edited).

        Args:
            data: what `to_json` returned, read back from JSON.
            root: the folder the paths are relative to (it may have moved since the split
                was made: the record's own `root` is not used).

        Returns:
            The split, its `root` set to `root`.

        Raises:
            ImageFolderError: a field is missing or not valid (named): a wrong format or
                version, a label out of range, a path absolute, with "..", or not in its
                class's folder, a path listed twice, a class without examples.
        """
        if not isinstance(data, dict):
            raise _error("A split record is a JSON object", _RECORD_ADVICE, "record", data)
        if data.get("format") != SPLIT_FORMAT or data.get("version") != SPLIT_VERSION:
            raise _field_error("format", data.get("format"), f"not {SPLIT_FORMAT} version 1")
        class_names = _field(data, "class_names", list)
        if (
            len(class_names) < 2
            or not all(
                isinstance(n, str) and _is_name(n) and not class_name_problem(n)
                for n in class_names
            )
            or class_names != sorted(set(class_names))
        ):
            raise _field_error("class_names", class_names, "not 2 or more sorted folder names")
        source = _field(data, "source", str)
        if source not in SOURCES:
            raise _field_error("source", source, f"not one of {SOURCES}")
        val_fraction = _field(data, "val_fraction", float)
        if not 0 < val_fraction < 1:
            raise _field_error("val_fraction", val_fraction, "not in (0, 1)")
        split_seed = _field(data, "split_seed", int)
        if split_seed < 0:
            raise _field_error("split_seed", split_seed, "negative")
        ignored = _field(data, "ignored", int)
        if ignored < 0:
            raise _field_error("ignored", ignored, "negative")
        skipped = _field(data, "skipped", list)
        if not all(_is_pair(item, str, str) for item in skipped):
            raise _field_error("skipped", skipped, "not a list of [path, problem]")
        examples = {
            name: _examples_field(data, name, class_names, source) for name in ("train", "val")
        }
        seen = set()
        for name, items in examples.items():
            for path, _ in items:
                if path in seen:
                    raise _field_error(name, path, "listing a path twice (in train or val)")
                seen.add(path)
        return cls(
            root=os.fspath(root),
            class_names=tuple(class_names),
            train=examples["train"],
            val=examples["val"],
            source=source,
            val_fraction=val_fraction,
            split_seed=split_seed,
            skipped=tuple((path, problem) for path, problem in skipped),
            ignored=ignored,
        )

    def save(self, path: str | os.PathLike) -> str:
        """Writes the split as JSON, atomically (a killed run leaves the old file or this).

        Args:
            path: the JSON file.

        Returns:
            `path`, as a string.
        """
        return _atomic.write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike, root: str | os.PathLike) -> "ImageFolderSplit":
        """Reads a split `save` wrote, checked as `from_json` does.

        Args:
            path: the JSON file.
            root: the folder the paths are relative to.

        Returns:
            The split.

        Raises:
            ImageFolderError: the file cannot be read, is over 1 GiB, is not JSON, or a
                field is not valid (see `from_json`); the message names the file.
        """
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_RECORD_BYTES + 1)
            if len(text) > MAX_RECORD_BYTES:
                raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
            data = json.loads(text)
        except (OSError, ValueError) as error:
            raise _error(
                f"The split record cannot be read ({error})", _RECORD_ADVICE, "path", path
            ) from None
        try:
            return cls.from_json(data, root)
        except ImageFolderError as error:
            raise ImageFolderError(f"In the split record {path!r}: {error}") from None


_RECORD_ADVICE = (
    "The record is written by scan_image_folder and must not be edited: use a new output "
    "folder to scan the images again."
)


def _field_error(name, value, problem):
    return _error(f"The split record's `{name}` is {problem}", _RECORD_ADVICE, name, value)


def _field(data, name, kind):
    value = data.get(name)
    if kind is float and _validation.is_number(value):
        return float(value)
    if kind is int and _validation.is_integer(value):
        return int(value)
    if kind not in (int, float) and isinstance(value, kind):
        return value
    raise _field_error(name, value, f"missing or not a {kind.__name__}")


def _is_pair(item, first, second):
    return (
        isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], first)
        and isinstance(item[1], second)
        and not isinstance(item[1], bool)
    )


def _is_name(name):
    """Whether `name` is one plain file or folder name (no separator, not . or ..)."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _caseless(name):
    """The form two names that file systems or readers may take for one share: Unicode's
    canonical caseless match (NFD, case folded, NFD again)."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


def _examples_field(data, name, class_names, source):
    """The (path, label) tuples of `train` or `val`: each path relative, inside its class's
    folder (`<class>/...`, or `train/<class>/...` and `val/<class>/...`)."""
    items = _field(data, name, list)
    examples = []
    for item in items:
        if not _is_pair(item, str, int) or not 0 <= item[1] < len(class_names):
            raise _field_error(name, item, f"not [path, label in [0, {len(class_names)})]")
        path, label = item
        parts = path.split("/")
        if os.path.isabs(path) or not all(_is_name(part) for part in parts):
            raise _field_error(name, path, "not a path inside the folder")
        if source == "folders":
            top = ("train",) if name == "train" else VAL_FOLDERS
            inside = len(parts) > 2 and parts[0] in top and parts[1] == class_names[label]
        else:
            inside = len(parts) > 1 and parts[0] == class_names[label]
        if not inside:
            raise _field_error(name, item, "a path outside its class's folder")
        examples.append((path, label))
    present = {label for _, label in examples}
    missing = [class_names[i] for i in range(len(class_names)) if i not in present]
    if missing:
        raise _field_error(name, missing, "without examples of some classes")
    return tuple(examples)


def scan_image_folder(
    root: str | os.PathLike,
    *,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    skip_damaged: bool = False,
    max_pixels: int = MAX_PIXELS,
) -> ImageFolderSplit:
    """Finds and checks a folder's labelled images, and splits them.

    With `root/train/` and `root/val/` (or `validation/`) folders, the split is theirs
    (the same class folders in both). Otherwise each class folder `root/<class>/` is split
    with `np.random.default_rng(split_seed)`: `round(n * val_fraction)` of its `n` images
    to validation, at least 1 and at most `n - 1`. Every image is decoded once here, as
    the pipeline will (`check_image_file`); a scan of many thousand photos takes minutes.

    Args:
        root: the folder.
        val_fraction: the fraction of each class for validation, in (0, 1).
        split_seed: the seed of the split, an integer >= 0.
        skip_damaged: skip (and record in `skipped`) the image files that cannot be used
            instead of refusing the folder.
        max_pixels: the most pixels an image may declare (`check_image_file`).

    Returns:
        The split; its paths are relative to `root`, sorted within each class.

    Raises:
        ImageFolderError: `root` is missing, not a folder or empty; fewer than 2 class
            folders; a class folder without images (or with fewer than 2 to split); the
            `train/` and `val/` folders' classes differ; two class names differ only in
            case or Unicode normalisation (`café` composed and decomposed); a class name
            that is blank or holds a line break, a control character (ESC...), a byte-order
            mark or a
            text-direction control (labels.txt holds one name a line, and the names are
            printed); a symbolic link loop, or a folder reached twice through links; a name
            that is not valid UTF-8; more than `MAX_FILES` files and folders; and unless
            `skip_damaged`, an image file that cannot be used (damaged, not an image, a
            decompression bomb, or its longer side over 100 times its shorter).
        ValueError: an argument out of range, or `root` not a path.
    """
    val_fraction, split_seed = _split_arguments(val_fraction, split_seed)
    max_pixels = _validation.positive_int(max_pixels, "max_pixels")
    if not isinstance(skip_damaged, bool):
        raise ValueError(f"`skip_damaged` must be True or False. Received: {skip_damaged=}")
    root = _check_root(root)
    if not os.path.isdir(root):
        problem = "is not a folder" if os.path.exists(root) else "does not exist"
        raise _error(f"The image folder {problem}", "Check the path.", "root", root)
    scan = _Scan(root, skip_damaged, max_pixels)
    folders, files = scan.listing(root)
    if not folders:
        problem = "The image folder is empty" if not files else "The image folder has no folders"
        raise _error(problem, _LAYOUT_ADVICE, "root", root)
    val_names = [name for name in VAL_FOLDERS if name in folders]
    if len(val_names) > 1 or ("train" in folders) != bool(val_names):
        found = [name for name in ("train", *VAL_FOLDERS) if name in folders]
        raise _error(
            f"The image folder has the folders {found}: a split by folders needs train/ and "
            "one of val/ or validation/",
            _LAYOUT_ADVICE,
            "root",
            root,
        )
    if val_names:
        scan.ignored += len(files)
        train_classes = scan.classes(os.path.join(root, "train"))
        val_classes = scan.classes(os.path.join(root, val_names[0]))
        if list(train_classes) != list(val_classes):
            differing = sorted(set(train_classes) ^ set(val_classes))
            raise _error(
                f"The train/ and {val_names[0]}/ folders have different class folders "
                f"(only in one: {differing})",
                "Give both the same class folders.",
                "root",
                root,
            )
        class_names = tuple(train_classes)
        train = _labelled(scan.labelled(train_classes, minimum=1))
        val = _labelled(scan.labelled(val_classes, minimum=1))
        source = "folders"
    else:
        classes = scan.classes(root, (folders, files))
        class_names = tuple(classes)
        train, val = _split(scan.labelled(classes, minimum=2), val_fraction, split_seed)
        source = "split"
    return ImageFolderSplit(
        root=root,
        class_names=class_names,
        train=train,
        val=val,
        source=source,
        val_fraction=val_fraction,
        split_seed=split_seed,
        skipped=tuple(scan.skipped),
        ignored=scan.ignored,
    )


_LAYOUT_ADVICE = (
    "Put the images in one folder per class (root/<class>/...), or in train/<class>/ and "
    "val/<class>/ folders."
)


def _check_root(root):
    """`root` as a str path; ValueError naming it unless it is a str or os.PathLike path
    (bytes are refused: the split record holds str paths)."""
    path = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise ValueError(
            "`root` (the image folder) must be a path, a str or os.PathLike. "
            f"Received: root={root!r}"
        )
    return path


def _split_arguments(val_fraction, split_seed):
    if not _validation.is_number(val_fraction) or not 0 < val_fraction < 1:
        raise ValueError(
            "`val_fraction` (the fraction of each class for validation) must be a number "
            f"in (0, 1). Received: val_fraction={val_fraction!r}"
        )
    return float(val_fraction), _validation.non_negative_int(split_seed, "split_seed")


def _labelled(classes):
    """(path, label) pairs of the paths of each class, in label order."""
    return tuple((path, label) for label, paths in enumerate(classes) for path in paths)


def _split(classes, val_fraction, split_seed):
    """Each class's paths split by one generator, the classes in label order."""
    rng = np.random.default_rng(split_seed)
    train, val = [], []
    for label, paths in enumerate(classes):
        count = min(max(round(len(paths) * val_fraction), 1), len(paths) - 1)
        order = rng.permutation(len(paths))
        val += sorted((paths[i], label) for i in order[:count])
        train += sorted((paths[i], label) for i in order[count:])
    return tuple(train), tuple(val)


class _Scan:
    """One walk of a folder tree: folders visited (by device and inode), entries counted,
    files ignored and skipped."""

    def __init__(self, root, skip_damaged, max_pixels):
        self.root, self.skip_damaged, self.max_pixels = root, skip_damaged, max_pixels
        self.visited, self.entries, self.ignored, self.skipped = {}, 0, 0, []

    def listing(self, path):
        """The sorted names of the folders and of the files in `path`, hidden ones left
        out (hidden files counted as ignored)."""
        folders, files = [], []
        try:
            status = os.stat(path)
            key = (status.st_dev, status.st_ino)
            if key in self.visited:
                raise _error(
                    f"The folder is {self.visited[key]!r} again, through a symbolic link: a "
                    "link loop, or two links to one folder (its images would be listed twice)",
                    "Remove the link.",
                    "path",
                    path,
                )
            self.visited[key] = path
            with os.scandir(path) as entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > MAX_FILES:
                        raise _error(
                            f"The image folder holds more than MAX_FILES ({MAX_FILES}) files "
                            f"and folders: {self.entries} so far",
                            "Check the root, or split the images into smaller folders.",
                            "root",
                            self.root,
                        )
                    is_folder = entry.is_dir()  # follows links; False for a broken one
                    if entry.name.startswith("."):
                        self.ignored += not is_folder
                    else:
                        (folders if is_folder else files).append(entry.name)
        except OSError as error:
            raise _error(
                f"The folder cannot be listed ({error.strerror})", "Check it.", "path", path
            ) from None
        return sorted(folders), sorted(files)

    def classes(self, folder, listed=None):
        """{class name: its folder} of `folder`'s subfolders, sorted by name; `listed`:
        the folder's `listing` when it was already read."""
        names, files = listed or self.listing(folder)
        self.ignored += len(files)
        if len(names) < 2:
            raise _error(
                f"The image folder has {len(names)} class folder(s) {names}; a classifier "
                "needs 2 or more",
                _LAYOUT_ADVICE,
                "path",
                folder,
            )
        seen = {}
        for name in names:
            path = os.path.join(folder, name)
            _check_utf8(path)
            problem = class_name_problem(name)
            if problem:
                raise _error(f"The class folder's name {problem}", "Rename it.", "path", path)
            other = seen.setdefault(_caseless(name), name)
            if other != name:
                how = "in case" if other.casefold() == name.casefold() else "in Unicode form"
                raise _error(
                    f"The class folders {ascii(other)} and {ascii(name)} differ only {how}: "
                    "they are one folder on case- or normalisation-insensitive file systems "
                    "(macOS, Windows) and look the same in a list of classes",
                    "Rename or merge them.",
                    "path",
                    folder,
                )
        return {name: os.path.join(folder, name) for name in names}

    def labelled(self, classes, minimum):
        """The usable images of each class (relative paths, one list per class in label
        order), each class with at least `minimum`."""
        found = []
        for folder in classes.values():
            paths = self.images(folder)
            problems = _problems(paths, self.max_pixels)
            for path, problem in zip(paths, problems, strict=True):
                if problem is not None and not self.skip_damaged:
                    raise _error(
                        f"An image file cannot be used: {problem}",
                        "Replace or remove it, or pass skip_damaged=True to skip (and "
                        "record) the files that cannot be used.",
                        "path",
                        path,
                    )
                if problem is not None:
                    self.skipped.append((self.relative(path), problem))
            usable = [
                self.relative(p) for p, bad in zip(paths, problems, strict=True) if bad is None
            ]
            if len(usable) < minimum:
                needed = "an image" if minimum == 1 else f"{minimum} images to split"
                raise _error(
                    f"The class folder has {len(usable)} usable image(s) (files ending in "
                    f"{', '.join(IMAGE_EXTENSIONS)}); it needs {needed}",
                    "Add images, or remove the folder.",
                    "path",
                    folder,
                )
            found.append(usable)
        return found

    def images(self, folder):
        """The image files under `folder`, nested folders included, sorted."""
        found, pending = [], [folder]
        while pending:  # a list, not recursion: a deep tree cannot overflow the stack
            path = pending.pop()
            folders, files = self.listing(path)
            for name in files:
                if has_image_extension(name):
                    found.append(os.path.join(path, name))
                else:
                    self.ignored += 1
            pending += [os.path.join(path, name) for name in folders]
        return sorted(found)

    def relative(self, path):
        return os.path.relpath(path, self.root).replace(os.sep, "/")


# Threads checking files: decoding releases Python's lock; each may hold one image of up
# to max_pixels (150 MB at 50 million).
_WORKERS = min(8, os.cpu_count() or 1)


def _problems(paths, max_pixels):
    """For each image file, None if the pipeline can read it, else its problem; checked in
    parallel, as many files take minutes (each is decoded)."""
    for path in paths:
        _check_utf8(path)
    with concurrent.futures.ThreadPoolExecutor(_WORKERS) as pool:
        return list(pool.map(lambda path: _problem(path, max_pixels), paths))


def _problem(path, max_pixels):
    try:
        width, height = check_image_file(path, max_pixels)
    except ImageFileError as error:
        return error.problem
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        return (
            f"The image is {width} x {height} pixels, its longer side more than "
            f"{MAX_ASPECT_RATIO} times its shorter: the evaluation resize refuses it"
        )
    return None


def _check_utf8(path):
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise _error(
            "The name is not valid UTF-8 (TensorFlow and the split record need it)",
            "Rename it.",
            "path",
            path,
        ) from None


class ImageFolderData(EpochData):
    """Images read from files, as `EpochData`: an epoch is a pure function of `(seed,
    epoch)`.

    Training: the files in `epoch_permutation(seed, epoch)`'s order, each decoded (a large
    JPEG at 1/2, 1/4 or 1/8 scale, by libjpeg, its shorter side kept at
    `TRAINING_DECODE_FACTOR * image_size` pixels or more: `decode_rgb(..., min_side)`),
    or, after `cache_images`, its pixels read from the cache (decoded once, the shorter
    side shrunk to `decode_min_side` at most); then a random-resized crop to `image_size`
    (and a random horizontal flip unless `flip` is False), scaled to [0, 1] and
    normalised with ImageNet's mean and standard deviation.
    Evaluation: the files in order, `applications.evaluation_preprocessing(image_size)`'s
    transform (resize the shorter side, crop the centre, normalise): the same pixels.
    Files are read and decoded in parallel, in a deterministic order, and the batches
    prefetched.

    Args:
        root: the folder the paths are relative to.
        examples: (path relative to `root` with "/" separators, label) pairs, checked
            files (`ImageFolderSplit.train` or `.val`).
        num_classes: the number of classes; labels are in [0, num_classes).
        image_size: the side of the square images made, an integer from 16 to 4096.
        flip: whether training flips images horizontally at random.
        training: whether this is a training split; a validation split (False) has
            evaluation epochs only.
        seed: the run's data seed.

    Attributes:
        labels: the examples' labels, int32.
        num_classes: as given.
        input_shape: (image_size, image_size, 3).
        resize_size: the evaluation resize's shorter side before the central crop.
        decode_min_side: the least shorter side of a training image downscaled as it is
            decoded, `TRAINING_DECODE_FACTOR * image_size`.

    Raises:
        ValueError: an argument out of range, or a label outside [0, num_classes).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        examples: Sequence[tuple[str, int]],
        num_classes: int,
        image_size: int = 224,
        flip: bool = True,
        training: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(_validation.non_negative_int(seed, "seed"))
        self.image_size, self.resize_size = evaluation_sizes(image_size)
        self.num_classes = _validation.positive_int(num_classes, "num_classes")
        self.input_shape = (self.image_size, self.image_size, 3)
        self.decode_min_side = TRAINING_DECODE_FACTOR * self.image_size
        for name, value in (("flip", flip), ("training", training)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
        self.flip, self.training = flip, training
        self._cached = None  # (cache file, height, width) per example, by cache_images
        self.root = os.path.abspath(root)  # read later, wherever the working folder is
        self.examples = tuple((str(path), int(label)) for path, label in examples)
        if not self.examples:
            raise ValueError(f"`examples` must not be empty. Received: examples={examples!r}")
        self.labels = np.array([label for _, label in self.examples], dtype=np.int32)
        if self.labels.min() < 0 or self.labels.max() >= self.num_classes:
            raise ValueError(
                f"`examples` must have labels in [0, num_classes={self.num_classes}). "
                f"Received: labels from {self.labels.min()} to {self.labels.max()}"
            )

    @property
    def num_examples(self) -> int:
        """The number of examples."""
        return len(self.examples)

    def cache_images(self, folder: str | os.PathLike) -> None:
        """Decodes the training images once into `folder` (`data.image_cache`), each
        shrunk to a shorter side of at most `decode_min_side`; training epochs then read
        the cached pixels instead of decoding the files. A cache left by a killed run is
        completed, not rebuilt. Evaluation still decodes the files (the exact pixels of
        `evaluation_preprocessing`).

        Args:
            folder: the cache folder (created).

        Raises:
            ValueError: a validation split (training=False).
            image_cache.ImageCacheError: `folder` is a file, or the disk lacks room.
        """
        if not self.training:
            raise ValueError(
                "Only training images are cached (evaluation decodes the files). "
                "Received: training=False"
            )
        paths = [self.path(i) for i in range(self.num_examples)]
        self._cached = build_image_cache(paths, folder, self.decode_min_side)

    @property
    def cached(self) -> bool:
        """Whether training epochs read cached pixels (`cache_images`)."""
        return self._cached is not None

    def path(self, index: int) -> str:
        """The file of example `index` (an index into `examples`), as an absolute path."""
        return os.path.join(self.root, *self.examples[index][0].split("/"))

    def subset(self, count: int) -> "ImageFolderData":
        """The first `count` examples (smoke tests).

        Args:
            count: how many, a positive integer.

        Returns:
            An `ImageFolderData` with the same settings.
        """
        count = _validation.positive_int(count, "count")
        subset = ImageFolderData(
            self.root,
            self.examples[:count],
            self.num_classes,
            self.image_size,
            self.flip,
            self.training,
            self.seed,
        )
        subset._cached = None if self._cached is None else self._cached[:count]
        return subset

    def _examples(self, epoch, training, prepare):
        if training and not self.training:
            raise ValueError(
                "This is a validation split (training=False): it has evaluation epochs "
                "only. Use eval_dataset, or epoch_dataset(..., training=False). "
                "Received: training=True"
            )
        paths = tf.constant([self.path(i) for i in range(self.num_examples)])
        labels = tf.constant(self.labels)
        if training:
            order = epoch_permutation(self.num_examples, self.seed, epoch)
        else:
            order = tf.range(self.num_examples)

        if training and self._cached is not None:
            files = tf.constant([file for file, _, _ in self._cached])
            shapes = tf.constant([[h, w] for _, h, w in self._cached], tf.int32)

        def load(index):
            if training and self._cached is not None:
                contents = tf.io.read_file(tf.gather(files, index))
                image = read_cached(contents, tf.gather(shapes, index))
                return prepare(image, tf.gather(labels, index), index)
            contents = tf.io.read_file(tf.gather(paths, index))
            # Evaluation: the full image, for evaluation_preprocessing's exact pixels.
            image = decode_rgb(contents, self.decode_min_side if training else None)
            if not training:
                image = self._evaluate(image)
            return prepare(image, tf.gather(labels, index), index)

        order = tf.data.Dataset.from_tensor_slices(tf.cast(order, tf.int64))
        return order.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _evaluate(self, image):
        image = transforms.resize_center_crop(image, self.resize_size, self.image_size)
        return transforms.normalize(image, applications.IMAGENET_MEAN, applications.IMAGENET_STD)

    def _augment(self, image, seed):
        image = transforms.random_resized_crop(image, seed, size=self.image_size, flip=self.flip)
        return transforms.normalize(image, applications.IMAGENET_MEAN, applications.IMAGENET_STD)


def image_folder(
    root: str | os.PathLike,
    *,
    image_size: int = 224,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    seed: int = 0,
    flip: bool = True,
    skip_damaged: bool = False,
    record: str | os.PathLike | None = None,
) -> tuple[ImageFolderData, ImageFolderData, ImageFolderSplit]:
    """A folder of labelled images as training and validation `ImageFolderData`.

    The folder is scanned and split by `scan_image_folder`. With `record` (a JSON file in
    the run's output folder), the split is saved there; when that file exists, it is read
    instead, and each file it lists must still be there and usable: a resumed or repeated
    run trains and validates on the same images.

    Args:
        root: the folder (see `scan_image_folder` for the layouts).
        image_size: the side of the square images the model takes, 16 to 4096.
        val_fraction: the fraction of each class for validation, in (0, 1).
        split_seed: the seed of the split.
        seed: the run's data seed (epoch order and augmentation).
        flip: whether training flips images horizontally at random (False for text,
            digits, anything whose mirror image is another thing).
        skip_damaged: skip the files that cannot be used instead of refusing the folder.
        record: the split's JSON file, or None not to record it.

    Returns:
        (training data, validation data, the split).

    Raises:
        ImageFolderError: as `scan_image_folder`; a record that cannot be read, was made
            with another `val_fraction` or `split_seed`, or lists files now missing or
            changed (named).
        ValueError: an argument out of range, or `root` not a path.
    """
    evaluation_sizes(image_size)  # refuse bad arguments before a long scan
    val_fraction, split_seed = _split_arguments(val_fraction, split_seed)
    root = _check_root(root)
    if record is not None and os.path.exists(record):
        split = ImageFolderSplit.load(record, root)
        _check_record(split, record, val_fraction, split_seed)
    else:
        split = scan_image_folder(
            root, val_fraction=val_fraction, split_seed=split_seed, skip_damaged=skip_damaged
        )
        if record is not None:
            split.save(record)
    made = [
        ImageFolderData(
            split.root, examples, len(split.class_names), image_size, flip, training, seed
        )
        for examples, training in ((split.train, True), (split.val, False))
    ]
    return made[0], made[1], split


def _check_record(split, record, val_fraction, split_seed):
    """The record was made with these arguments, and its files are all still usable."""
    if split.source == "split" and (split.val_fraction, split.split_seed) != (
        val_fraction,
        split_seed,
    ):
        raise ImageFolderError(
            f"The split record {os.fspath(record)!r} was made with val_fraction="
            f"{split.val_fraction} and split_seed={split.split_seed}. Pass those, or use a "
            "new output folder to split the images again. Received: "
            f"val_fraction={val_fraction}, split_seed={split_seed}"
        )
    paths = [path for path, _ in split.train + split.val]
    problems = _problems([os.path.join(split.root, *p.split("/")) for p in paths], MAX_PIXELS)
    bad = [f"{path} ({problem})" for path, problem in zip(paths, problems, strict=True) if problem]
    if bad:
        listed = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise _error(
            f"{len(bad)} of the files the split record {os.fspath(record)!r} lists are "
            f"missing or changed: {listed}",
            "Restore them, or use a new output folder to scan the images again.",
            "root",
            split.root,
        )
