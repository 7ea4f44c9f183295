"""The API reference (docs/reference/, mkdocstrings) covers every public name, documented.

`mkdocs build --strict` (in .ci/run) checks that each `::: name` resolves and every link
holds; these tests check what it cannot: that no public name is left off the pages and
that each public function and class has its own docstring.
"""

import importlib
import inspect
import pathlib
import re
import types

import pytest

import keras_autoshuffle

ROOT = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
# The modules whose public names the API reference renders (their `__all__`, or for a
# module without one, its public functions and classes).
MODULES = [
    "applications",
    "callbacks",
    "constraints",
    "data",
    "export",
    "folding",
    "hardening",
    "hub",
    "layers",
    "optimizers",
    "permutations",
    "regularizers",
    "training",
]


def _directives():
    """{module path: [the page text after each of its `::: path` lines]} over the reference
    pages (a module split over several pages, each with its `members:`, has one per page)."""
    found = {}
    for page in sorted(REFERENCE.glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n|\n)*)", text, re.M):
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def _members(options):
    """The names a directive's `members:` list gives (none: the module's public names)."""
    return re.findall(r"^        - (\w+)$", options, re.M)


def _public_names(module):
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "").startswith(module.__name__)
    ]


def _training_names():
    training = importlib.import_module("keras_autoshuffle.training")
    return [
        name
        for name, value in vars(training).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]


def test_every_module_has_a_reference_page():
    directives = _directives()
    for name in MODULES:
        assert f"keras_autoshuffle.{name}" in directives, name


def test_training_page_lists_every_public_name():
    # `training` has no `__all__`: its page lists the members by hand, so a new name
    # must be added there.
    (options,) = _directives()["keras_autoshuffle.training"]
    listed = set(_members(options))
    assert set(_training_names()) <= listed, set(_training_names()) - listed


def test_a_module_split_over_pages_lists_each_public_name_once():
    # `applications` has a page per unit (each family, the weights, the preprocessing), each
    # listing its `members:`; a new public name must go on one of them. mkdocs.yml's
    # `filters` leave `CHECKPOINTS` off (the registry presents it by name).
    split = {name: pages for name, pages in _directives().items() if len(pages) > 1}
    assert "keras_autoshuffle.applications" in split
    for name, pages in split.items():
        listed = [member for options in pages for member in _members(options)]
        assert all(_members(options) for options in pages), name  # else a page shows all
        public = set(_public_names(importlib.import_module(name))) - {"CHECKPOINTS"}
        assert sorted(listed) == sorted(public), name


def test_top_level_names_are_on_the_reference_index():
    index = (REFERENCE / "index.md").read_text()
    names = [
        name
        for name, value in vars(keras_autoshuffle).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]
    missing = [name for name in names if f"`{name}`" not in index]
    assert not missing, missing


@pytest.mark.parametrize("module_name", MODULES)
def test_public_functions_and_classes_have_docstrings(module_name):
    module = importlib.import_module(f"keras_autoshuffle.{module_name}")
    names = _training_names() if module_name == "training" else _public_names(module)
    undocumented = []
    for name in names:
        value = getattr(module, name)
        if inspect.isclass(value):
            if not (vars(value).get("__doc__") or "").strip():
                undocumented.append(name)
        elif callable(value) and not (getattr(value, "__doc__", None) or "").strip():
            undocumented.append(name)
    assert not undocumented, undocumented
