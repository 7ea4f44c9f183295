"""One run at a time uses a folder: `locked_folder` holds an `fcntl.flock` on its
`run.lock` while the run lives (the system releases it when the process ends, killed or
not; a PID file alone would not survive PID reuse), and a second run is refused naming
the first. `RunDirectoryError` is the error of a folder that cannot be used as asked.
"""

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator

# The lock a living run holds on its folder (`locked_folder`); it names the run's PID.
LOCK_FILE = "run.lock"


class RunDirectoryError(ValueError):
    """An output directory that cannot be used as asked (finished, other settings, damaged)."""


def unusable_folder(output_dir: str | os.PathLike, error: OSError) -> RunDirectoryError:
    """The RunDirectoryError for an output folder the system refuses (`error`: an OSError,
    e.g. a file where the folder or one above it should be)."""
    return RunDirectoryError(
        f"The output folder cannot be used ({error.strerror or error}: "
        f"{error.filename or output_dir}). Received: output_dir={output_dir!r}"
    )


@contextlib.contextmanager
def locked_folder(folder: str | os.PathLike) -> Iterator[None]:
    """Holds the run lock of `folder` (created with its parents) meanwhile. On leaving,
    the lock file is removed, and the folders this call created where they hold nothing
    (a run refused at once leaves no trace).

    Raises:
        RunDirectoryError: another living run holds the lock ("another run (PID N) is
            using this folder"), the lock file is not a regular file, or the system
            refuses the folder (a file in its path, a read-only disk, ...).
    """
    given, folder = os.fspath(folder), os.path.abspath(folder)
    path = os.path.join(folder, LOCK_FILE)
    created, parent = None, folder
    while not os.path.lexists(parent):
        created, parent = parent, os.path.dirname(parent)
    try:
        descriptor = _take_lock(path)
    except BaseException as error:
        _remove_empty(folder, created)
        if isinstance(error, OSError):
            raise unusable_folder(given, error) from None
        raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # removed while held: no other run has it then
            os.remove(path)
        _remove_empty(folder, created)
        os.close(descriptor)


def _remove_empty(folder, created):
    """Removes `folder` and its parents up to `created` (None: none) while they are empty."""
    with contextlib.suppress(OSError):  # one holding anything stays
        while created and os.path.commonpath([folder, created]) == created:
            os.rmdir(folder)
            folder = os.path.dirname(folder)


def _take_lock(path):
    """A descriptor of the lock file `path` holding its exclusive lock, its content this
    process's PID (shown to a refused run)."""
    while True:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # No link followed, no FIFO waited on; a folder fails to open for writing.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            descriptor = os.open(path, flags, 0o644)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise _not_a_lock(path, error.strerror) from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise _not_a_lock(path, "not a regular file")
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
                raise RunDirectoryError(
                    f"another run (PID {holder or 'unknown'}) is using this folder: "
                    f"{os.path.dirname(path)}. Wait for it to end, or use another output "
                    f"folder. Received: output_dir={os.path.dirname(path)!r}"
                ) from None
            # The holder may have removed the file between our open and lock: lock anew.
            if os.path.lexists(path) and os.path.samestat(os.stat(path), os.fstat(descriptor)):
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
                return descriptor
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)


def _not_a_lock(path, problem):
    return RunDirectoryError(
        f"The run's lock file {path} is not a regular file ({problem}): delete it (no run "
        f"uses it) and run again. Received: output_dir={os.path.dirname(path)!r}"
    )
