"""The package's import graph, read from the source (nothing is imported).

Every `import` and `from ... import` of every module counts, those inside functions
included: a lazy import only moves a circle to the first call. `from keras_autoshuffle.x
import y` is an edge to the submodule `x.y` when there is one, else to `x`.
"""

import ast
import pathlib

PACKAGE = "keras_autoshuffle"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE
APPLICATIONS = f"{PACKAGE}.applications"


def module_files():
    """{module name: path} for every module of the package (a package by its name)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def is_package(name):
    """Whether module `name` is a package (an `__init__.py`)."""
    return MODULES[name].name == "__init__.py"


def imports(name):
    """[(imported module, imported name or None, line)] of module `name`, in the package."""
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(), str(MODULES[name]))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = name if is_package(name) else name.rpartition(".")[0]
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return [item for item in found if item[0] in MODULES]


def graph():
    """{module: {imported modules}} over the package's own modules."""
    return {name: {module for module, _, _ in imports(name)} - {name} for name in MODULES}


def find_cycle(edges):
    """One import circle as a list [a, b, ..., a], or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def public_names(package):
    """The names in `package`'s `__all__` (read from its `__init__.py`)."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def private_uses(name, package):
    """What module `name` takes from `package` beyond its `__all__`: ['line: what']."""
    allowed = public_names(package)
    tree = ast.parse(MODULES[name].read_text())
    bad, aliases = [], set()
    for module, imported, line in imports(name):
        if module.startswith(f"{package}."):
            bad.append(f"{line}: module {module}")
        elif module == package and imported is not None and imported not in allowed:
            bad.append(f"{line}: {package}.{imported}")
    for node in ast.walk(tree):  # `from keras_autoshuffle import applications` as an alias
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            aliases |= {a.asname or a.name for a in node.names if a.name == "applications"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == package and a.asname}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in allowed
        ):
            bad.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_the_walk_sees_lazy_imports_and_submodules():
    # Guards the walk itself: a lazy import inside a function, and `from package import
    # submodule`, are edges.
    edges = graph()
    assert "keras_autoshuffle.applications.architecture" in edges["keras_autoshuffle.folding"]
    lazy = {m for m, _, _ in imports("keras_autoshuffle.training.cli")}
    assert "keras_autoshuffle.finetuning.report" in lazy  # imported inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_training_and_data_use_only_the_public_applications():
    bad = {
        name: private_uses(name, APPLICATIONS)
        for name in MODULES
        if name.startswith((f"{PACKAGE}.training", f"{PACKAGE}.data"))
    }
    bad = {name: uses for name, uses in bad.items() if uses}
    assert not bad, f"private names of {APPLICATIONS} used (not in its __all__): {bad}"
