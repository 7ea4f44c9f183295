"""Keras's global dtype policy for a block: the builders make every layer under it."""

import contextlib

import keras


@contextlib.contextmanager
def global_dtype_policy(policy):
    """Keras's global dtype policy set to `policy` (None: left as it is) meanwhile, then
    restored: every layer a builder makes takes it (as keras-hub passes `dtype` to each
    layer)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(previous if policy is None else policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
