"""A griffe extension for the API reference: docstrings assigned at import.

The four builders share one docstring template filled at import
(`ShuffleNetV2.__doc__ = ...`, as keras.applications writes it), which griffe's static
reading of the source does not see. For a public function that has no docstring in the
source, this imports its module and takes the docstring it has at run time; everything
else stays static (instance attributes and attribute docstrings are only in the source).
"""

import importlib
import inspect

import griffe


class RuntimeDocstrings(griffe.Extension):
    """Fills in the docstring of a public function that gets one only at import."""

    def on_function_instance(self, *, node, func, agent, **kwargs):
        if func.docstring is not None or func.name.startswith("_") or not func.parent.is_module:
            return
        module = importlib.import_module(func.module.path)
        text = inspect.getdoc(getattr(module, func.name, None))
        if text:
            func.docstring = griffe.Docstring(
                text,
                parent=func,
                parser=agent.docstring_parser,
                parser_options=agent.docstring_options,
            )
