"""Registers the keras-hub classes (`keras_autoshuffle.hub`) once keras-hub is imported,
without importing keras-hub (2 s) with the package.

keras-hub finds the class of a preset folder among Keras's registered objects, so
`keras_hub.models.ImageClassifier.from_preset(folder)` needs `keras_autoshuffle.hub`
imported. `install()` imports it now when keras-hub already is, else when keras-hub's
import finishes (a finder on `sys.meta_path` that wraps keras-hub's loader).
"""

import importlib
import importlib.abc
import importlib.util
import sys

HUB, OURS = "keras_hub", "keras_autoshuffle.hub"


class _AfterKerasHub(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps keras-hub's loader so that `OURS` is imported after it."""

    def find_spec(self, name, path=None, target=None):
        if name != HUB:
            return None
        sys.meta_path.remove(self)  # once; and the other finders find the real spec
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            importlib.import_module(OURS)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Imports `keras_autoshuffle.hub` now if keras-hub is imported, else after it is."""
    if HUB in sys.modules:
        importlib.import_module(OURS)
    elif not any(isinstance(finder, _AfterKerasHub) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasHub())
