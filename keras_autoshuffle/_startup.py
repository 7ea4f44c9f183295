"""TensorFlow's start-up lines, kept off a command's screen (imports nothing heavy).

TensorFlow 2.19 and later print some lines from C++ while their libraries load, whatever
`TF_CPP_MIN_LOG_LEVEL` says (tensorflow/tensorflow#100442). `import_quietly` imports a
module with file descriptor 2 sent to a temporary file, then writes back only the lines
the setting lets through. In an installed command `TF_CPP_MIN_LOG_LEVEL` defaults to "2"
(errors only); elsewhere the user's setting is honoured, nothing filtered where it is
unset or "0".
"""

import contextlib
import importlib
import os
import re
import sys
import tempfile
import threading

# The installed commands' names start so (pyproject.toml's [project.scripts]).
COMMAND_PREFIX = "autoshuffle-"
# The level the commands run TensorFlow's C++ logs at unless the user set one: errors only.
COMMAND_LOG_LEVEL = "2"

# One C++ log record's first line: absl's ("I0000 00:00:1795890570.622023   17712 file.cc:31]")
# or TensorFlow's older one ("2025-09-17 14:44:05.157831: I external/.../file.cc:32]").
_ABSL_RECORD = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]")
_TF_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) \S+:\d+\]")
_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}
# absl's notice that the records above went to stderr: noise once they are filtered.
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
# A record's further lines (cpu_feature_guard.cc's second line starts so).
_CONTINUATIONS = (" ", "\t", "To enable the following instructions")
# Lines the runtimes write to descriptor 2 at every log level, notices a user can do nothing
# with: LiteRT's interpreter, at each load ("INFO: Created TensorFlow Lite XNNPACK delegate
# for CPU."), and its converter's settings of an int8 file ("fully_quantize: 0, ...").
RUNTIME_NOTICES = re.compile(r"INFO: Created TensorFlow Lite XNNPACK delegate|fully_quantize: ")
# Descriptor 2 is the process's: one redirection at a time, or two overlapping threads would
# restore each other's temporary file (reentrant: a quiet block may hold another).
_REDIRECT_LOCK = threading.RLock()


def running_as_command(argv0: str | None = None) -> bool:
    """Whether this process is one of the installed `autoshuffle-*` commands (by `argv0`,
    default `sys.argv[0]`; a Windows launcher's `.exe` counts)."""
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
    return re.split(r"[\\/]", argv0)[-1].startswith(COMMAND_PREFIX)  # either separator


def min_log_level() -> int:
    """`TF_CPP_MIN_LOG_LEVEL` as TensorFlow reads it (0: everything; unset or unreadable: 0)."""
    try:
        return max(0, int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")))
    except ValueError:
        return 0


def filter_log_lines(text: str, level: int) -> str:
    """`text` without the C++ log records below `level` (0..3: info, warning, error, fatal)
    and absl's notice about them. A record's continuation lines (indented, or TensorFlow's
    "To enable the following instructions") go with it; every other line (Python's warnings,
    anything unrecognised) is kept."""
    kept = []
    keep = True  # the current record's fate, for its continuation lines
    for line in text.splitlines(keepends=True):
        record = _ABSL_RECORD.match(line) or _TF_RECORD.match(line)
        if record:
            keep = _LEVELS[record.group(1)] >= level
        elif line.startswith(_ABSL_NOTICE):
            continue
        elif not line.startswith(_CONTINUATIONS):
            keep = True
        if keep:
            kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def quiet_stderr(level: int | None = None, drop=None):
    """Sends file descriptor 2 to a temporary file for the block, then writes back what
    `filter_log_lines` keeps at `level` (default `TF_CPP_MIN_LOG_LEVEL`) and `drop` (a
    function of a line) does not reject; everything if the block raises (the lines may say
    why). A no-op at level 0 without `drop`."""
    level = min_log_level() if level is None else level
    if level == 0 and drop is None:
        yield
        return
    with _REDIRECT_LOCK:  # from the saving of descriptor 2 to its restoring
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (AttributeError, OSError, ValueError):  # no descriptor 2 (pythonw, closed)
            saved = None
        if saved is None:
            yield
            return
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            failed = True
            try:
                yield
                failed = False
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                text = captured.read().decode("utf-8", "replace")
                if not failed:
                    text = filter_log_lines(text, level)
                    if drop is not None:
                        text = "".join(line for line in text.splitlines(True) if not drop(line))
                if text:
                    sys.stderr.write(text)
                    sys.stderr.flush()


def quiet_runtime():
    """`quiet_stderr` that also drops `RUNTIME_NOTICES`, around a runtime's load or a
    converter's run: in an installed command or where `TF_CPP_MIN_LOG_LEVEL` is above 0
    (they are not log records); elsewhere at level 0 nothing is redirected or filtered."""
    if running_as_command() or min_log_level() > 0:
        return quiet_stderr(drop=RUNTIME_NOTICES.match)
    return contextlib.nullcontext()


def import_quietly(name: str):
    """Imports module `name`, TensorFlow's start-up lines below `TF_CPP_MIN_LOG_LEVEL` left out
    of stderr (the other lines are written once the import ends; all of them if it fails)."""
    if name in sys.modules:
        return sys.modules[name]
    with quiet_stderr():
        return importlib.import_module(name)


def find_devices_quietly() -> list:
    """TensorFlow's physical devices, found with its CUDA lines kept off the screen when there
    is no GPU (on a machine without one, "failed call to cuInit" is an error-level line that
    only says so); called by the commands before their work, where TensorFlow would first
    look for devices. Initialises no runtime: a distribution strategy can still be made."""
    try:
        import tensorflow as tf
    except ImportError:
        return []
    cuda = re.compile(r"cuda|cuInit|GPU", re.IGNORECASE)
    found = {}

    def drop(line):
        return not found["gpu"] and bool(cuda.search(line))

    with quiet_stderr(drop=drop if min_log_level() else None):  # level 0: every line
        devices = tf.config.list_physical_devices()
        found["gpu"] = any(device.device_type == "GPU" for device in devices)
    return devices


def import_keras():
    """Imports Keras for the package's `__init__`: quietly, and in an installed command with
    TensorFlow's C++ logs at errors only unless the user set `TF_CPP_MIN_LOG_LEVEL` (set
    before TensorFlow loads, since it reads it once)."""
    if running_as_command():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", COMMAND_LOG_LEVEL)
    return import_quietly("keras")


# The package's `__init__` imports this module before any other: Keras loads here.
import_keras()
