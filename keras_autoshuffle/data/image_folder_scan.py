"""The scan of a folder of labelled images (`scan_image_folder`): its layout, classes and
files found and checked before any training, then split (`image_folder_split`).

Layouts, as `keras.utils.image_dataset_from_directory` reads them: `root/<class>/...`
(split per class with a seeded generator, `source="split"`), or `root/train/<class>/...`
and `root/val/<class>/...` (or `validation/`; `source="folders"`). Images in nested
folders count; files without an image extension and hidden files and folders are
ignored, as Keras does; class names are sorted as Keras sorts them. Symbolic links to
folders are followed, each folder once.
"""

import concurrent.futures
import os
import unicodedata

import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._class_names import class_name_problem
from keras_autoshuffle._resize_crop import MAX_ASPECT_RATIO
from keras_autoshuffle.data.image_folder_split import VAL_FOLDERS, ImageFolderSplit, _error
from keras_autoshuffle.data.images import (
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    ImageFileError,
    check_image_file,
    has_image_extension,
)

# Files and folders a scan visits at most: a wrong root (a home folder, a disk) is refused
# instead of being walked for hours.
MAX_FILES = 10_000_000


def scan_image_folder(
    root: str | os.PathLike,
    *,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    skip_damaged: bool = False,
    max_pixels: int = MAX_PIXELS,
) -> ImageFolderSplit:
    """Finds and checks a folder's labelled images, and splits them.

    With `root/train/` and `root/val/` (or `validation/`) folders, the split is theirs.
    Otherwise each class folder is split with `np.random.default_rng(split_seed)`:
    `round(n * val_fraction)` of its `n` images to validation, at least 1 and at most
    `n - 1`. Every image is decoded once here, as the pipeline will (`check_image_file`).

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
        ImageFolderError: `root` missing, not a folder or empty; fewer than 2 class
            folders, or one without (enough) images; `train/` and `val/` with other
            classes; class names differing only in case or Unicode form, or holding a
            line break or control character; a symbolic link loop; a name not valid
            UTF-8; more than `MAX_FILES` entries; unless `skip_damaged`, an image file
            that cannot be used (named, with its problem).
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


def _caseless(name):
    """The form two names that file systems or readers may take for one share: Unicode's
    canonical caseless match (NFD, case folded, NFD again)."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())
