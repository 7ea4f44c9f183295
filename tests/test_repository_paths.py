"""No page, code or test names a path of the machine it was written on (issue 52): a
command shown to users, a default or a recipe in a docstring works from any checkout, so it
names paths inside the repository (e.g. `runs/`, which git ignores) or the user's own.

Exempt: the rows a run wrote (JSON and JSON lines under docs/: docs/results/, a study's
result.json), which record where that run read and wrote, as they record its date and load.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("docs", "experiments", "keras_autoshuffle", "scripts", "tests", ".ci")
TOP_FILES = ("README.md", "CHANGELOG.md", "CITATION.cff", "pyproject.toml", "mkdocs.yml")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".sh", ".json", ".jsonl"}
SKIPPED_FOLDERS = {"__pycache__", "site", ".jax_cache", ".pytest_cache", ".ruff_cache"}
# An absolute path under a folder that belongs to one machine or user: temporary files,
# home folders, mounts, this project's build machine (/work). Not after a word character,
# a dot or a dash (`runs/tmp/x`, `../home`, a URL's host), so relative paths and URLs pass;
# system paths such as /dev/null or /proc/cpuinfo are the same on every machine and pass.
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:tmp|root|home|work|Users|mnt|media|scratch|private|var/tmp|var/folders)"
    r"/[^\s\"'`),\]]*"
)
# Named on purpose: Keras's own fallback cache (`keras.utils.get_file`'s docs name it so).
ALLOWED = {("keras_autoshuffle/applications/weights/registry.py", "/tmp/.keras")}
# A test line that builds such a path deliberately (a page must not show it) ends with this
# comment; this file's own examples are exempt as a whole.
ON_PURPOSE = "# a machine's path, on purpose"


def _is_record(relative):
    """The rows a run wrote: JSON (lines) under docs/."""
    return relative.startswith("docs/") and relative.endswith((".json", ".jsonl"))


def _text_files():
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not parts & SKIPPED_FOLDERS:
                files.append(path)
    return files


def machine_paths(text):
    """The absolute paths of one machine that `text` names."""
    return [match.group() for match in MACHINE_PATH.finditer(text)]


def test_the_pattern_catches_machine_paths_and_passes_the_rest():
    caught = "--page /work/main/docs/x.md, `/tmp/fm_v2/model.keras` (file:///home/me/a.pth)"
    assert machine_paths(caught) == [
        "/work/main/docs/x.md",
        "/tmp/fm_v2/model.keras",
        "/home/me/a.pth",
    ]
    passed = "> /dev/null; runs/tmp/x; ../home/x; https://example.org/home/x; /proc/cpuinfo"
    assert machine_paths(passed) == []


def test_no_page_code_or_test_names_a_path_of_the_machine():
    found = []
    for path in _text_files():
        relative = path.relative_to(ROOT).as_posix()
        if _is_record(relative) or relative == "tests/test_repository_paths.py":
            continue
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        for line_number, line in enumerate(text.splitlines(), 1):
            if relative.startswith("tests/") and line.rstrip().endswith(ON_PURPOSE):
                continue
            for name in machine_paths(line):
                if (relative, name) not in ALLOWED:
                    found.append(f"{relative}:{line_number}: {name}")
    assert len(found) == 0, "\n".join(found)
