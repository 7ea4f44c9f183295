"""Registers the keras-hub classes (`keras_autoshuffle.hub`) once keras-hub is imported,
without importing keras-hub (1.5 s) with the package.

keras-hub finds the class of a preset folder among Keras's registered objects, so
`keras_hub.models.ImageClassifier.from_preset(folder)` needs `keras_autoshuffle.hub`
imported. `install()` imports it now when keras-hub already is, else when keras-hub's
import finishes (a finder on `sys.meta_path` that wraps keras-hub's loader). The finder
stays until keras-hub's module really executes: `importlib.util.find_spec("keras_hub")`,
the probe many libraries make, finds a spec without importing it.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

HUB, OURS = "keras_hub", "keras_autoshuffle.hub"


def _import_ours() -> None:
    """Imports `OURS`; a failure is a warning, so that the user's `import keras_hub` works."""
    try:
        importlib.import_module(OURS)
    except Exception as error:
        warnings.warn(
            f"{OURS} could not be imported, so keras-hub does not find keras_autoshuffle's "
            f"presets: {type(error).__name__}: {error}",
            stacklevel=2,
        )


class _AfterKerasHub(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps keras-hub's loader so that `OURS` is imported after it."""

    def __init__(self) -> None:
        self._finding = False  # inside our own find_spec: let the other finders answer

    def find_spec(self, name, path=None, target=None):
        if name != HUB or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module  # a loader of this spec only: a probe drops it

        def exec_module(module):
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # keras-hub is imported: once is enough
            _import_ours()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Imports `keras_autoshuffle.hub` now if keras-hub is imported, else after it is."""
    if HUB in sys.modules:
        _import_ours()
    elif not any(isinstance(finder, _AfterKerasHub) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasHub())
