"""Argument checks shared by the package: one wording for each kind of bad value.

Every error names the argument and ends in `Received: name=value`, as Keras's do.
Booleans never pass as numbers (`True` is an int in Python).
"""

import math
import numbers

import keras
import numpy as np

DATA_FORMATS = ("channels_last", "channels_first")


def is_number(value):
    """Whether `value` is a real number, Python's or NumPy's (`np.float32(0.5)`), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_finite_number(value: object) -> bool:
    """`is_number(value)`, and neither NaN nor infinite: as a float (an int past the float
    range, 10**400, is not; `np.isfinite` refuses ints past int64 with a TypeError)."""
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:
        return False


def one_line(error: object) -> str:
    """An exception's text on one line, for messages that must stay one line."""
    return " ".join(str(error).split())


def is_integer(value):
    """Whether `value` is an integer, Python's or NumPy's (`np.int64(3)`), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def positive_int(value, name):
    """`value` as an int; ValueError unless it is an integer >= 1."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def non_negative_int(value, name):
    """`value` as an int; ValueError unless it is an integer >= 0."""
    if not is_integer(value) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0. Received: {name}={value!r}")
    return int(value)


def seed(value, name="seed"):
    """`value` as an int; ValueError unless it is an integer in [0, 2**32 - 1] (NumPy's and
    TensorFlow's seeds are 32-bit)."""
    if not is_integer(value) or not 0 <= value < 2**32:
        raise ValueError(
            f"`{name}` must be an integer in [0, 2**32 - 1]. Received: {name}={value!r}"
        )
    return int(value)


def optional_positive_int(value, name):
    """None, or `positive_int(value, name)`."""
    return None if value is None else positive_int(value, name)


def positive_float(value, name):
    """`value` as a float; ValueError unless it is a finite number > 0."""
    if not is_finite_number(value) or not value > 0:
        raise ValueError(f"`{name}` must be a finite number > 0. Received: {name}={value!r}")
    return float(value)


def optional_positive_float(value, name):
    """None, or `positive_float(value, name)`."""
    return None if value is None else positive_float(value, name)


# lambda * P(M) must stay finite in float32 for any N this package builds (P(M) < 2 N,
# N <= 2048 in the largest v2): above 1e30 the loss overflows to inf.
MAX_PENALTY = 1e30


def penalty(value, name="penalty"):
    """The weight lambda of the l1-2 penalty: a finite number in [0, 1e30], as a float."""
    if not is_finite_number(value) or value < 0 or value > MAX_PENALTY:
        raise ValueError(
            f"`{name}` (lambda, the weight of the l1-2 penalty) must be a finite number in "
            f"[0, {MAX_PENALTY:g}]. Received: {name}={value!r}"
        )
    return float(value)


def choice(value, allowed, name):
    """The element of `allowed` equal to `value` (so NumPy's `np.int64(3)` gives the
    plain 3 of `allowed`); ValueError naming `name` otherwise (bools never pass as
    numbers)."""
    if isinstance(value, (bool, np.bool_)) and not any(a is value for a in allowed):
        raise ValueError(f"`{name}` must be one of {list(allowed)}. Received: {name}={value!r}")
    try:
        ok = value in allowed
    except TypeError:  # unhashable or incomparable
        ok = False
    if not ok:
        raise ValueError(f"`{name}` must be one of {list(allowed)}. Received: {name}={value!r}")
    return next(a for a in allowed if a is value or a == value)


def boolean(value, name):
    """`value` as a bool: True or False (NumPy's too), never 1, 0 or "yes"; ValueError
    naming `name` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    return bool(value)


def data_format(value):
    """`value` or Keras's `image_data_format()`, checked."""
    return choice(value or keras.config.image_data_format(), DATA_FORMATS, "data_format")


def channel_axis(data_format_value=None):
    """-1 for channels_last, 1 for channels_first (None: Keras's `image_data_format()`)."""
    value = data_format_value or keras.config.image_data_format()
    return -1 if value == "channels_last" else 1


def percentage_points(value, name):
    """`value` as a float (-0.0 as 0.0); ValueError unless it is a number of percentage
    points in [0, 100] (no NaN, no inf: an accuracy cannot drop by more than 100)."""
    if not is_number(value) or not 0 <= value <= 100:
        raise ValueError(
            f"`{name}` must be a number of percentage points in [0, 100]. "
            f"Received: {name}={value!r}"
        )
    return float(value) + 0.0


def non_negative_float(value, name):
    """`value` as a float; ValueError unless it is a finite number >= 0 (no NaN, no inf)."""
    if not is_finite_number(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0. Received: {name}={value!r}")
    return float(value)


def fraction_below_one(value, name):
    """`value` as a float; ValueError unless it is a number in [0, 1)."""
    if not is_number(value) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")
    return float(value)
