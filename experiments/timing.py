"""Interleaved timing and paired ratios, without TensorFlow (the runtime-only child processes
of `runtime_processes.py` import it as well as `benchmark.py`)."""

import math
import time

import numpy as np


def measure(
    functions,
    repeats,
    min_seconds=0.0,
    clock=time.perf_counter,
    number=None,
    seed=0,
    pause=0.0,
    warmup=0,
):
    """Milliseconds per call of each function in each of `repeats` interleaved rounds (`clock`:
    wall time, or `time.process_time` for the process's CPU time): {name: [ms, ...]}. Each
    round calls a function `number` times in a row (by default as often as `min_seconds`
    takes, from one timed call after a warm-up), after `pause` idle seconds and `warmup`
    calls of the same function (both untimed: the thread pools of the function before stop
    spinning, docs/lab-notes/inference.md)."""
    numbers = {}
    for name, fn in functions.items():
        fn()  # warm-up (tracing, allocation)
        start = clock()
        fn()
        once = max(clock() - start, 1e-6)
        numbers[name] = number or max(1, math.ceil(min_seconds / once))
    samples = {name: [] for name in functions}
    # A new random order each round, so that no variant always follows the same one: with a
    # fixed order, rotated, ONNX Runtime's folded / manual read 1.28-1.34x beside the other
    # runtimes, 0.93-0.98x in random orders (docs/lab-notes/inference.md).
    names, order = list(functions), np.random.default_rng(seed)
    for _ in range(repeats):
        for name in (names[i] for i in order.permutation(len(names))):
            fn, count = functions[name], numbers[name]
            if pause:
                time.sleep(pause)
            for _ in range(warmup):
                fn()
            start = clock()
            for _ in range(count):
                fn()
            samples[name].append(1000 * (clock() - start) / count)
    return samples


def paired_ratio(samples, reference, seed=0):
    """(median, low, high) of the per-round ratios `samples[i] / reference[i]`: the rounds
    pair the two (timed minutes apart at most, under the same load), and low-high is a 95%
    bootstrap interval of the median. None when the rounds do not pair."""
    if samples is None or len(samples) == 0 or len(samples) != len(reference):
        return None
    ratios = np.asarray(samples) / np.asarray(reference)
    draws = np.random.default_rng(seed).choice(ratios, (2000, ratios.size))
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)
