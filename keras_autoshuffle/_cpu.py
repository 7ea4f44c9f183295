"""This machine's CPU as Linux's /proc/cpuinfo names it: the one reader of its model name
and feature flags (reports, the int8 weight-bits default, the test log's summary)."""

import functools


@functools.cache
def cpu_info() -> tuple[str | None, frozenset[str] | None]:
    """`(model name, feature flags)` of the first CPU in /proc/cpuinfo; None for what cannot
    be read (another OS, a missing field)."""
    name = flags = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name is None:
                    name = value.strip()
                elif key.strip() == "flags" and flags is None:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return name, flags
