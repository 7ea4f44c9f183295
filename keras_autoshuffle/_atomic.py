"""Atomic writes: a killed process leaves the old version of a file or the new one, never a mix.

Each file (or folder, e.g. a SavedModel) is written under a temporary name in the same
folder (`sibling_path`: `model.keras` -> `model.partial.keras`, a name the writers that
check a suffix accept), flushed to disk, then moved into place with `os.replace`, atomic
within a file system. A folder cannot replace a non-empty folder in one rename: the old
one is renamed aside first (`.old`), so for an instant the path is missing, never a mix.
A leftover temporary of a killed writer is removed by the next write.

A cache entry that several processes may build at once (`write_shared`) is written under a
name of its own writer (pid and a random suffix) and moved into place only if no other
writer's copy got there first.
"""

import json
import os
import secrets
import shutil


def sibling_path(path, tag="partial"):
    """`path` with `.tag` before its suffixes, in the same folder (by default the temporary
    name it is written under)."""
    folder, name = os.path.split(os.fspath(path))
    stem, dot, suffixes = name.partition(".")
    return os.path.join(folder, f"{stem}.{tag}{dot}{suffixes}")


def remove(path):
    """Removes a file, link or folder tree; nothing if `path` does not exist."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def remove_written(path):
    """Removes `path` and what a killed writer left of it (its temporaries)."""
    for version in (path, sibling_path(path), sibling_path(path, "old")):
        remove(version)


def sync(path):
    """Flushes a file, or every file of a folder tree and the folder entries, to disk."""
    if not os.path.isdir(path):
        return _fsync(path, os.O_RDONLY)
    for folder, _, names in os.walk(path):
        for name in names:
            _fsync(os.path.join(folder, name), os.O_RDONLY)
        _fsync(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync(path, flags):
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def move_into_place(temporary, path):
    """Moves a written file or folder `temporary` to `path`, replacing what is there."""
    sync(temporary)
    if os.path.isdir(temporary) and os.path.lexists(path):
        old = sibling_path(path, "old")
        remove(old)
        os.replace(path, old)
        os.replace(temporary, path)
        remove(old)
    else:
        os.replace(temporary, path)
    _sync_entry(path)


def _sync_entry(path):
    """Flushes `path`'s entry in its folder: the parent's entry only, as walking the
    parent's tree would flush every file beside `path` (all of /tmp, a run's checkpoints)
    and block on a named pipe there."""
    _fsync(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def write_atomically(path, write):
    """Calls `write(temporary)` (writing a file or folder there), then moves what it wrote
    into place; returns `path`."""
    path = os.fspath(path)
    temporary = sibling_path(path)
    remove(temporary)
    try:
        write(temporary)
    except BaseException:
        remove(temporary)
        raise
    move_into_place(temporary, path)
    return path


def write_shared(path, write, is_whole):
    """Like `write_atomically`, for a folder that concurrent processes may write with the
    same content (a cache entry): each writes under a temporary of its own; the first to
    move it into place wins and the others keep the winner's folder. A folder at `path`
    that `is_whole(path)` refuses is replaced; returns `path`."""
    path = os.fspath(path)
    temporary = sibling_path(path, f"partial-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write(temporary)
        sync(temporary)
        try:
            os.rename(temporary, path)  # fails if another writer's folder is there
        except OSError:
            if not is_whole(path):
                move_into_place(temporary, path)
        _sync_entry(path)
    finally:
        remove(temporary)
    return path


def _json_default(value):
    return value.item() if hasattr(value, "item") else str(value)


def write_json(path, value):
    """Writes `value` as JSON atomically (NumPy scalars as numbers, other objects as text)."""
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)

    def write(partial):
        with open(partial, "w") as f:
            json.dump(value, f, indent=2, default=_json_default)

    return write_atomically(path, write)


def as_json(value):
    """`value` as `write_json` would store and read it back (tuples as lists, ...)."""
    return json.loads(json.dumps(value, default=_json_default))
