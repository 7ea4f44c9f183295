"""ONNX Runtime or OpenVINO alone, a fresh process per sample: the package's ShuffleNet v2
1.0x files (manual and folded) against torchvision's graph in the same runtime, at 2 threads.

Why: in `experiments.benchmark` the ratios between ONNX Runtime sessions moved with what else
the process ran and in which order. Folded / manual read 1.28x and 1.34x with LiteRT and
OpenVINO timed in the same rounds in a fixed order, rotated; 0.93x and 0.98x in a random
order; with ONNX Runtime alone 0.86x and 0.91x (rotated), 1.15x and 1.03x (random). Several
of those runs' intervals exclude the others' values, so the spread is between processes
more than within one: here a sample is a process. Each child imports only the runtime
(onnxruntime or openvino) and numpy (no TensorFlow, no other runtime), times the files in
rounds of a new random order, and gives the median of its per-round ratios. The summary is
the mean of those over `--processes` children with a 95% t interval.

The files are `export.export_onnx`'s (the padded NCHW graph) or `export.export_openvino`'s
(an IR folder, not padded), written from
`ShuffleNetV2(1.0, stem="imagenet", classifier_activation=None)` with torchvision's seeded
weights (`experiments/torchvision_onnx.py`'s folder); torchvision's graph is its ONNX file
in either runtime (OpenVINO reads ONNX). Every file's outputs are checked first (Keras
against torch's logits, each file against torch's logits). OpenVINO compiles as
`export.openvino_model` does (latency hint, `--threads` inference threads).

Usage:
    python -m experiments.runtime_processes --torchvision DIR [--runtime openvino]
        [--processes 8] [--json rows.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from experiments.timing import measure

CHILD = "--child"


RUNTIMES = ("onnxruntime", "openvino")


def _calls(runtime, files, threads, x):
    """{name: a call running that file once} in `runtime` (NCHW input for "torchvision")."""
    calls = {}
    for name, path in files.items():
        inputs = x.transpose(0, 3, 1, 2).copy() if name == "torchvision" else x
        if runtime == "onnxruntime":
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            session = onnxruntime.InferenceSession(
                path, options, providers=["CPUExecutionProvider"]
            )
            feed = {session.get_inputs()[0].name: inputs}
            calls[name] = lambda s=session, f=feed: s.run(None, f)
        else:
            import openvino

            core = openvino.Core()
            model = core.read_model(path)
            model.reshape({model.inputs[0]: list(inputs.shape)})
            config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
            compiled = core.compile_model(model, "CPU", config)
            calls[name] = lambda c=compiled, a=inputs: c(a)
    return calls


def time_sessions(files, threads, rounds, calls, seed, side=224, runtime="onnxruntime"):
    """Per-round milliseconds per call of each file {name: path} in `runtime` (a `side` x
    `side` NHWC input, or NCHW for the name "torchvision"), each round in a new random order."""
    x = np.random.default_rng(0).normal(size=(1, side, side, 3)).astype("float32")
    return measure(_calls(runtime, files, threads, x), rounds, number=calls, seed=seed)


def write_files(directory, torchvision_dir, runtime="onnxruntime"):
    """{name: path}: the package's manual and folded v2 1.0x with torchvision's weights, as
    `runtime` reads them, and torchvision's ONNX file; every output checked (see the module)."""
    from experiments import benchmark
    from keras_autoshuffle import export
    from keras_autoshuffle.applications import ShuffleNetV2

    torchvision = benchmark.load_torchvision(torchvision_dir)
    spec = (ShuffleNetV2, {"width": 1.0})
    variants = ("manual", "manual_folded")
    models = benchmark.build_variants("v2_1.0", spec, 224, 1000, variants, None, torchvision)
    nhwc = torchvision[2].transpose(0, 2, 3, 1).copy()
    if runtime == "onnxruntime":
        write, outputs = export.export_onnx, export.onnx_outputs
    else:
        write, outputs = openvino_xml, export.openvino_outputs
    files = {}
    for name, model in models.items():
        files[name] = write(
            model, f"{directory}/{name}{'.onnx' if runtime == 'onnxruntime' else ''}"
        )
        diff = benchmark._max_diff(outputs(files[name], nhwc), torchvision[3])
        if not diff <= benchmark.OUTPUT_TOLERANCE:
            raise SystemExit(f"error: {name}'s {runtime} file differs from torch by {diff:.3e}")
    files["torchvision"] = torchvision[0]
    diff = benchmark._max_diff(outputs(files["torchvision"], torchvision[2]), torchvision[3])
    if not diff <= benchmark.OUTPUT_TOLERANCE:
        raise SystemExit(f"error: torchvision's file in {runtime} differs from torch by {diff:.3e}")
    return files


def openvino_xml(model, folder):
    """`export.export_openvino` into `folder`; returns the path of its `.xml` file (what a
    child reads without importing the package)."""
    from keras_autoshuffle.export import export_openvino
    from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML

    return os.path.join(export_openvino(model, folder), OPENVINO_XML)


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
    runtime, files = argv[0], json.loads(argv[1])
    threads, rounds, calls, seed = (int(v) for v in argv[2:6])
    samples = time_sessions(files, threads, rounds, calls, seed, runtime=runtime)
    ratios = {
        f"{a}/{b}": float(np.median(np.array(samples[a]) / np.array(samples[b]))) for a, b in RATIOS
    }
    medians = {name: float(np.median(ms)) for name, ms in samples.items()}
    version = __import__(runtime).__version__
    print(json.dumps({"median_ms": medians, "ratios": ratios, runtime: version}))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torchvision", metavar="DIR", required=True)
    parser.add_argument("--runtime", choices=RUNTIMES, default="onnxruntime")
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
        files = write_files(directory, args.torchvision, args.runtime)
        for seed in range(args.processes):
            command = [sys.executable, "-m", "experiments.runtime_processes", CHILD, args.runtime]
            command.append(json.dumps(files))
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
