"""ONNX Runtime alone, a fresh process per sample: the package's ShuffleNet v2 1.0x ONNX files
(manual and folded) against torchvision's graph, at 2 threads.

Why: in `experiments.benchmark` the ratios between ONNX Runtime sessions moved with what else
the process ran and in which order. Folded / manual read 1.28x and 1.34x with LiteRT and
OpenVINO timed in the same rounds in a fixed order, rotated; 0.93x and 0.98x in a random
order; with ONNX Runtime alone 0.86x and 0.91x (rotated), 1.15x and 1.03x (random). Several
of those runs' intervals exclude the others' values, so the spread is between processes
more than within one: here a sample is a process. Each child imports only onnxruntime and
numpy (no TensorFlow, no other runtime), times the files in rounds of a new random order,
and gives the median of its per-round ratios. The summary is the mean of those over
`--processes` children with a 95% t interval.

The files are `export.export_onnx`'s (the padded NCHW graph), written from
`ShuffleNetV2(1.0, stem="imagenet", classifier_activation=None)` with torchvision's seeded
weights (`experiments/torchvision_onnx.py`'s folder); every file's outputs are checked first
(Keras against torch's logits, each file against Keras, torchvision's file against torch).

Usage:
    python -m experiments.ort_processes --torchvision DIR [--processes 8] [--json rows.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = "--child"


def time_sessions(files, threads, rounds, calls, seed, side=224):
    """Per-round milliseconds per call of each ONNX file {name: path} (a `side` x `side` NHWC
    input, or NCHW for the name "torchvision"), each round in a new random order."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    x = np.random.default_rng(0).normal(size=(1, side, side, 3)).astype("float32")
    calls_of = {}
    for name, path in files.items():
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x.transpose(0, 3, 1, 2).copy()}
        if name != "torchvision":
            feed = {session.get_inputs()[0].name: x}
        calls_of[name] = lambda s=session, f=feed: s.run(None, f)
    samples = {name: [] for name in files}
    names, order = list(files), np.random.default_rng(seed)
    for name in names:  # warm-up
        for _ in range(3):
            calls_of[name]()
    for _ in range(rounds):
        for name in (names[i] for i in order.permutation(len(names))):
            start = time.perf_counter()
            for _ in range(calls):
                calls_of[name]()
            samples[name].append(1000 * (time.perf_counter() - start) / calls)
    return samples


def write_files(directory, torchvision_dir):
    """{name: ONNX path}: the package's manual and folded v2 1.0x with torchvision's weights,
    and torchvision's own file; every output checked (see the module)."""
    from experiments import benchmark
    from keras_autoshuffle import export
    from keras_autoshuffle.applications import ShuffleNetV2

    torchvision = benchmark.load_torchvision(torchvision_dir)
    spec = (ShuffleNetV2, {"width": 1.0})
    variants = ("manual", "manual_folded")
    models = benchmark.build_variants("v2_1.0", spec, 224, 1000, variants, None, torchvision)
    nhwc = torchvision[2].transpose(0, 2, 3, 1).copy()
    files = {}
    for name, model in models.items():
        files[name] = export.export_onnx(model, f"{directory}/{name}.onnx")
        diff = benchmark._max_diff(export.onnx_outputs(files[name], nhwc), torchvision[3])
        if not diff <= benchmark.OUTPUT_TOLERANCE:
            raise SystemExit(f"error: {name}'s ONNX file differs from torch by {diff:.3e}")
    files["torchvision"] = torchvision[0]
    diff = benchmark._max_diff(
        export.onnx_outputs(files["torchvision"], torchvision[2]), torchvision[3]
    )
    if not diff <= benchmark.OUTPUT_TOLERANCE:
        raise SystemExit(f"error: torchvision's ONNX file differs from torch by {diff:.3e}")
    return files


RATIOS = (
    ("manual_folded", "manual"),
    ("manual_folded", "torchvision"),
    ("manual", "torchvision"),
)


def summary(processes):
    """{"a/b": (mean, low, high, n)} over the processes' medians of per-round ratios."""
    from scipy import stats

    table = {}
    for a, b in RATIOS:
        values = np.array([p["ratios"][f"{a}/{b}"] for p in processes])
        low, high = stats.t.interval(0.95, len(values) - 1, values.mean(), stats.sem(values))
        table[f"{a}/{b}"] = (float(values.mean()), float(low), float(high), len(values))
    return table


def child(argv):
    files = json.loads(argv[0])
    threads, rounds, calls, seed = (int(v) for v in argv[1:5])
    samples = time_sessions(files, threads, rounds, calls, seed)
    ratios = {
        f"{a}/{b}": float(np.median(np.array(samples[a]) / np.array(samples[b]))) for a, b in RATIOS
    }
    medians = {name: float(np.median(ms)) for name, ms in samples.items()}
    import onnxruntime

    print(
        json.dumps({"median_ms": medians, "ratios": ratios, "onnxruntime": onnxruntime.__version__})
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torchvision", metavar="DIR", required=True)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls timed together")
    parser.add_argument("--json", help="write the processes' rows and the summary here")
    args = parser.parse_args(argv)
    for name in ("processes", "threads", "rounds", "calls"):
        if getattr(args, name) < (2 if name == "processes" else 1):
            parser.error(f"--{name} is too small. Received: {name}={getattr(args, name)}")
    if not os.path.isdir(args.torchvision):
        parser.error(f"--torchvision is not a folder. Received: torchvision={args.torchvision!r}")
    processes = []
    with tempfile.TemporaryDirectory() as directory:
        files = write_files(directory, args.torchvision)
        for seed in range(args.processes):
            command = [sys.executable, "-m", "experiments.ort_processes", CHILD, json.dumps(files)]
            command += [str(v) for v in (args.threads, args.rounds, args.calls, seed)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
            if done.returncode:
                raise SystemExit(f"error: timing process {seed} failed:\n{done.stderr[-2000:]}")
            processes.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(processes[-1]), flush=True)
    table = summary(processes)
    for name, (mean, low, high, n) in table.items():
        print(f"{name}: {mean:.3f} (95% t interval {low:.3f}-{high:.3f}, {n} processes)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"processes": processes, "summary": table, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
