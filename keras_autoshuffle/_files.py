"""File helpers shared by the packages: a file's hash (weights downloads and backups check
it), and bounded reads of files that may come from anyone."""

import hashlib
import os
import stat


def sha256_of(path):
    """The SHA-256 of a file, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file `path` (a FIFO would block: OSError), read up to
    `limit` bytes (more: ValueError "larger than `limit` bytes")."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(f"not a regular file: {os.fspath(path)}")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data
