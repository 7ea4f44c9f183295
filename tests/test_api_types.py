"""The API reference shows a type for every parameter and return of a public function.

griffe reads the source statically, as mkdocstrings does for the pages (no import: well
under a second). The objects checked are those docs/reference/*.md render: the members of
each `::: module` directive (its `members:` list, or the module's public names), and of a
class its `__init__`, public methods and properties, less the Keras hooks mkdocs.yml's
`filters` leave off the pages (build, call, on_epoch_end, ...). A module constant the
pages render shows its value, not an expression of other constants (`tuple(LOADERS)`).
"""

import ast
import pathlib
import re

import griffe
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _options():
    """mkdocs.yml's options of the python handler."""
    plugins = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["plugins"]
    options = next(
        p["mkdocstrings"] for p in plugins if isinstance(p, dict) and "mkdocstrings" in p
    )
    return options["handlers"]["python"]["options"]


def _hidden():
    """The names mkdocs.yml's `filters` leave off the pages, as one regex."""
    filters = _options()["filters"]
    assert all(f.startswith("!") for f in filters), filters
    return re.compile("|".join(f"(?:{f[1:]})" for f in filters))


def _rendered():
    """The functions, classes, properties and module constants the pages render, by path."""
    loader = griffe.GriffeLoader(search_paths=[ROOT])
    for module in _options().get("preload_modules", ()):  # as mkdocstrings preloads them
        loader.load(module)
    package = loader.load("keras_autoshuffle")
    loader.resolve_aliases()
    hidden, found = _hidden(), {}
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n|\n)*)", page.read_text(), re.M):
            options = match.group(2)
            if re.search(r"^\s+members: false$", options, re.M):
                continue
            module = package.modules_collection[match.group(1)]
            names = re.findall(r"^        - (\w+)$", options, re.M)
            public = [n for n, m in module.members.items() if m.is_public and not hidden.search(n)]
            names = names or public
            for name in names:
                obj = module.members[name]
                obj = obj.final_target if obj.is_alias else obj
                members = [obj]
                if obj.is_attribute or obj.is_class:
                    found[obj.path] = obj
                if obj.is_class:
                    members = [
                        m
                        for n, m in obj.members.items()
                        if not m.is_alias and (n == "__init__" or not hidden.search(n))
                    ]
                for member in members:
                    if member.is_function or "property" in member.labels:
                        found[member.path] = member
    return found


def _untyped(obj):
    """What lacks an annotation: parameter names, and "return"."""
    if obj.is_class or (obj.is_attribute and "property" not in obj.labels):
        return []  # a class's types are its __init__'s; a constant
    if not obj.is_function:  # a property
        return [] if obj.annotation is not None else ["return"]
    parameters = list(obj.parameters)
    if obj.parent.is_class and "staticmethod" not in obj.labels:
        parameters = parameters[1:]  # self, cls
    missing = [p.name for p in parameters if p.annotation is None]
    return missing + ([] if obj.returns is not None else ["return"])


@pytest.fixture(scope="module")
def rendered():
    return _rendered()


def test_the_pages_render_functions(rendered):
    # The collection itself: a broken directive regex would make the checks below vacuous.
    assert len(rendered) > 100, len(rendered)
    assert "keras_autoshuffle.layers.RelaxedShuffle.__init__" in rendered
    assert "keras_autoshuffle.layers.RelaxedShuffle.permutation" in rendered
    assert "keras_autoshuffle.layers.RelaxedShuffle.call" not in rendered  # a Keras hook


def test_every_rendered_parameter_and_return_has_a_type(rendered):
    untyped = {
        path: missing for path, obj in sorted(rendered.items()) if (missing := _untyped(obj))
    }
    assert not untyped, "\n".join(f"{path}: {', '.join(m)}" for path, m in untyped.items())


def test_every_returns_section_is_one_row(rendered):
    # A Returns continuation line indented as the first line parses as a second return
    # value: one more row in the page's table.
    split = [
        path
        for path, obj in sorted(rendered.items())
        if obj.docstring is not None
        and any(
            section.kind is griffe.DocstringSectionKind.returns and len(section.value) > 1
            for section in obj.docstring.parse("google")
        )
    ]
    assert not split, split


def test_every_documented_parameter_is_one_of_the_signature(rendered):
    # An Args entry naming two parameters (`atol, rtol:`) or none of the signature's gets
    # no type from the annotations: an empty Type cell.
    stray = {}
    for path, obj in sorted(rendered.items()):
        if obj.docstring is None or not (obj.is_function or obj.is_class):
            continue
        names = {p.name for p in obj.parameters}
        for section in obj.docstring.parse("google"):
            if section.kind is griffe.DocstringSectionKind.parameters:
                stray[path] = [p.name for p in section.value if p.name.lstrip("*") not in names]
    stray = {path: names for path, names in stray.items() if names}
    assert not stray, stray


def _constants_named(constant):
    """The other constants of its module that `constant`'s value names."""
    named = []
    for node in ast.walk(ast.parse(str(constant.value), mode="eval")):
        other = constant.parent.members.get(node.id) if isinstance(node, ast.Name) else None
        if other is not None and other is not constant:
            try:
                other = other.final_target if other.is_alias else other
            except griffe.AliasResolutionError:  # a name from outside the package
                continue
            if other.is_attribute:
                named.append(node.id)
    return named


def test_every_rendered_constant_shows_its_value(rendered):
    constants = [obj for obj in rendered.values() if obj.is_attribute and obj.parent.is_module]
    assert any(obj.name == "DATASETS" for obj in constants), "no constant collected"
    expressions = {
        obj.path: str(obj.value)
        for obj in constants
        if obj.value is not None and _constants_named(obj)
    }
    assert not expressions, expressions


def test_constants_written_out_match_what_they_list():
    from keras_autoshuffle.data import registry

    assert registry.DATASETS == tuple(registry.LOADERS)
    from keras_autoshuffle.applications import architecture

    assert architecture.V2_WIDTHS == tuple(architecture.V2_CONFIGS)
    assert architecture.V1_GROUPS == tuple(architecture.V1_STAGE2_WIDTHS)
