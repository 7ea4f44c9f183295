"""Renamed arguments and attributes: the old name still works, with a DeprecationWarning.

An old keyword reaches `__init__` from user code and from the config of a saved file
(Keras calls `cls(**config)`), so one check serves both: files saved with the old config
keys still load, `safe_mode=True` included.
"""

import warnings


def _warn(message):
    # stacklevel 4: the caller of the `__init__` (or of the property) that was given the
    # old name, through this function and `renamed_argument`.
    warnings.warn(message, DeprecationWarning, stacklevel=4)


def renamed_argument(owner, kwargs, old, new, value, default, replacement=None):
    """The value of argument `new`, or that of its deprecated name `old` popped from `kwargs`.

    Args:
        owner: the class name, for the messages.
        kwargs: the call's extra keywords; `old` is removed from them.
        value, default: `new`'s value in the call and its default.
        replacement: what the warning tells users to write instead (default `new=`).

    Raises:
        TypeError: both names given (`new` with a value other than its default).
    """
    if old not in kwargs:
        return value
    old_value = kwargs.pop(old)
    if value is not default and value != default:
        raise TypeError(
            f"{owner} got `{new}` and its deprecated name `{old}`: pass `{new}` only. "
            f"Received: {old}={old_value!r}, {new}={value!r}"
        )
    _warn(
        f"`{owner}({old}=...)` is deprecated: write `{replacement or new + '='}` instead "
        f"(files saved with `{old}` still load)."
    )
    return old_value


def no_other_keywords(owner, kwargs):
    """TypeError for keywords left after the renamed ones are taken (Python's wording)."""
    if kwargs:
        raise TypeError(f"{owner}() got an unexpected keyword argument {next(iter(kwargs))!r}")


def renamed_attributes(**renames):
    """A `__getattr__` serving deprecated attribute names (`old="new"`), with a
    DeprecationWarning. Python calls it only where normal lookup fails, so `dir()` (which
    Keras's saving walks, reading every attribute) never meets the old names."""

    def __getattr__(self, name):
        new = renames.get(name)
        if new is None:
            # A base class's own `__getattr__` (torch.nn.Module's, on the torch backend,
            # serves sub-modules and parameters) still answers every other name.
            mro = type(self).__mro__
            owner = next(i for i, k in enumerate(mro) if vars(k).get("__getattr__") is __getattr__)
            for base in mro[owner + 1 :]:
                if "__getattr__" in vars(base):
                    return vars(base)["__getattr__"](self, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(
            f"`{type(self).__name__}.{name}` is deprecated: read `{new}`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, new)

    return __getattr__
