"""The split of a folder of images into training and validation examples
(`ImageFolderSplit`), its JSON record, checked field by field when read back (a record may
be edited), and the error every problem with a folder or record raises
(`ImageFolderError`).
"""

import dataclasses
import json
import os
from dataclasses import asdict

import numpy as np

from keras_autoshuffle import _atomic, _validation
from keras_autoshuffle._atomic import as_json
from keras_autoshuffle._class_names import class_name_problem
from keras_autoshuffle._files import read_bounded

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
        """The split as JSON values (what `save` writes): a dict of lists, strings and
        numbers."""
        return {"format": SPLIT_FORMAT, "version": SPLIT_VERSION, **as_json(asdict(self))}

    @classmethod
    def from_json(cls, data: dict, root: str | os.PathLike) -> "ImageFolderSplit":
        """The split `to_json` gave, checked field by field (a record may be edited).

        Args:
            data: what `to_json` returned, read back from JSON.
            root: the folder the paths are relative to (the record's own `root` is not
                used: the folder may have moved).

        Returns:
            The split, its `root` set to `root`.

        Raises:
            ImageFolderError: a field missing or not valid (named): a wrong format or
                version, a label out of range, a path outside its class's folder or
                listed twice, a class without examples.
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
        """Writes the split as JSON to `path`, atomically; returns `path` as a string."""
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
                field is not valid; the message names the file.
        """
        path = os.fspath(path)
        try:
            data = json.loads(read_bounded(path, MAX_RECORD_BYTES))
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
