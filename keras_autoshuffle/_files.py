"""File helpers shared by the packages: a file's hash (weights downloads and backups check it)."""

import hashlib


def sha256_of(path):
    """The SHA-256 of a file, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
