"""Where ONNX Runtime spends an int8 file's time against its float file: ONNX Runtime's
own profiler (`SessionOptions.enable_profiling`), kernel time per op type per run, batch 1,
2 intra-op threads, on the files `experiments.int8_peers write` makes (issue 53, item 3).

The profiler's own cost inflates every time (model_run is about twice an unprofiled run):
read the shares and the op types' ratios, not the milliseconds. Not in CI.

Usage (the torch venv of `experiments.int8_peers`, or any venv with onnxruntime):
    python -m experiments.ort_op_profile runs/int8_peers/ours/model.onnx \
        runs/int8_peers/ours/model_int8.onnx --json docs/results/ort_op_profile_cpu.json
"""

import argparse
import collections
import datetime
import json
import os
import tempfile

import numpy as np

from experiments.int8_peers import _cpu


def profile(path, runs=300, warmup=30, threads=2):
    """{op type: (ms per run, nodes)}, and the session's ms per run, over warmup + runs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "profile")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    spec = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in spec.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    for _ in range(warmup + runs):
        session.run(None, {spec.name: x})
    with open(session.end_profiling()) as f:
        events = json.load(f)
    calls, times, nodes, total = warmup + runs, collections.Counter(), collections.Counter(), 0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            times[event["args"]["op_name"]] += event["dur"]
            nodes[event["args"]["op_name"]] += 1
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            total += event["dur"]
    ops = {op: {"ms": times[op] / calls / 1000, "nodes": nodes[op] // calls} for op in times}
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]["ms"])), total / calls / 1000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", help="append the row to this JSON list")
    args = parser.parse_args(argv)
    import onnxruntime

    row = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": _cpu(),
        "onnxruntime": onnxruntime.__version__,
        "files": {},
    }
    for path in args.files:
        ops, run_ms = profile(path, args.runs)
        row["files"][path] = {"model_run_ms": run_ms, "ops": ops}
        print(f"{path}: {run_ms:.3f} ms per profiled run")
        for op, entry in ops.items():
            print(f"  {op:26s} {entry['ms']:7.3f} ms  x{entry['nodes']}")
    if args.json:
        rows = json.load(open(args.json)) if os.path.exists(args.json) else []
        with open(args.json, "w") as f:
            json.dump(rows + [row], f, indent=1)


if __name__ == "__main__":
    main()
