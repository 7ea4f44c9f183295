"""Does one ONNX Runtime session slow the next one in the same process? A probe.

ONNX Runtime's intra-op worker threads spin for a while after a call before they sleep. Two
sessions in one process on a 2-core machine: session A's block of calls is timed right
after A's own block, right after session B's block (B spinning, the default), right after a
block of B2 (the same file, spinning turned off: `session.intra_op.allow_spinning = 0`), and
after 0.1 s of idle time. Rounds of the four, the median of each over the rounds.

Usage:
    python -m experiments.ort_spinning FILE.onnx [--rounds 15] [--calls 20] [--json rows.json]
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def _session(path, spinning=True, threads=2):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0]
    shape = [1 if not isinstance(d, int) else d for d in name.shape]
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    return lambda: session.run(None, {name.name: x})


def probe(path, rounds=15, calls=20):
    """{condition: median ms per call of session A's block} (see the module docstring)."""
    a, b, quiet_b = _session(path), _session(path), _session(path, spinning=False)

    def block(fn):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return 1000 * (time.perf_counter() - start) / calls

    for fn in (a, b, quiet_b):
        block(fn)
    conditions = {
        "after its own block": a,
        "after another session's block (spinning)": b,
        "after another session's block (not spinning)": quiet_b,
        "after 0.1 s idle": None,
    }
    samples = {name: [] for name in conditions}
    for _ in range(rounds):
        for name, before in conditions.items():
            if before is None:
                time.sleep(0.1)
            else:
                block(before)
            samples[name].append(block(a))
    return {name: float(np.median(ms)) for name, ms in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("onnx_file")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args(argv)
    for name in ("rounds", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {name}={getattr(args, name)}")
    if not os.path.isfile(args.onnx_file):
        parser.error(f"no such file. Received: onnx_file={args.onnx_file!r}")
    medians = probe(args.onnx_file, args.rounds, args.calls)
    for name, ms in medians.items():
        print(f"{name}: {ms:.3f} ms a call")
    if args.json:
        import onnxruntime

        with open(args.json, "w") as f:
            row = {
                "medians_ms": medians,
                "args": vars(args),
                "onnxruntime": onnxruntime.__version__,
            }
            json.dump(row, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
