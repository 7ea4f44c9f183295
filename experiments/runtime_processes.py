"""ONNX Runtime, OpenVINO or LiteRT, a fresh process per sample: the package's ShuffleNet v2
1.0x files (manual and folded) against torchvision's graph, at 2 threads.

Why: in `experiments.benchmark` the ratios between ONNX Runtime sessions moved with what else
the process ran and in which order. Folded / manual read 1.28x and 1.34x with LiteRT and
OpenVINO timed in the same rounds in a fixed order, rotated; 0.93x and 0.98x in a random
order; with ONNX Runtime alone 0.86x and 0.91x (rotated), 1.15x and 1.03x (random). Several
of those runs' intervals exclude the others' values, so the spread is between processes
more than within one: here a sample is a process. Each child imports only the runtime
(onnxruntime or openvino; with litert, ai-edge-litert and onnxruntime) and numpy (no
TensorFlow), times the files in rounds of a new random order (`--pause` idle seconds before
each block: with ONNX Runtime alone, 0.1 s made every file about 25% faster and moved folded /
torchvision's graph from 0.90 to 0.83, docs/lab-notes/inference.md), and gives the median of its
per-round ratios. The summary is the mean of those over `--processes` children with a 95%
t interval. Before each timed block, `--warmup` untimed calls of the same file (default: as
many as the block): ONNX Runtime's worker threads spin on after a call, and a block timed
right after another session's block ran 1.18x and 1.61x slower in two runs of
`experiments/ort_spinning.py` (docs/lab-notes/inference.md), which no single-session user sees.
Runs 1-9 of docs/results/runtime_processes_onnxruntime_cpu.json had no warm-up calls.

The files are `export.export_onnx`'s (the padded NCHW graph) or `export.export_openvino`'s
(an IR folder, not padded) or `export.export_litert`'s (`.tflite`), written from
`ShuffleNetV2(1.0, stem="imagenet", classifier_activation=None)` with torchvision's seeded
weights (`experiments/torchvision_onnx.py`'s folder); torchvision's graph is its ONNX file
in ONNX Runtime or OpenVINO (OpenVINO reads ONNX). Every file's outputs are checked first
(Keras against torch's logits, each file against torch's logits). OpenVINO compiles as
`export.openvino_model` does (latency hint, `--threads` inference threads, float32:
`--openvino-precision f32`, the default; OpenVINO's own default is bfloat16 on CPUs with
AVX512_BF16 or AMX), and each row names that precision (`openvino_precision`).

LiteRT has no reader of torchvision's graph, so `--runtime litert` times the `.tflite` files
(the LiteRT interpreter, XNNPACK, `--threads`) against torchvision's graph in ONNX Runtime,
two runtimes in one process. Each block of calls then follows a pause (`--pause`, 0.1 s),
so that one runtime's spinning thread pool has stopped before the other's block starts. The
control: the folded ONNX file in ONNX Runtime is timed in the same rounds, and its ratio to
torchvision's graph must match what ONNX Runtime alone gives.

`--files NAME=PATH ...` times files of one runtime given as they are, each against the
first, in the same way: a paired comparison of two ways of writing a file (a file whose
name starts with "torchvision" gets NCHW input, every other NHWC).

A child also runs TorchScript files (`.pt`, torch's engine, NCHW input: the int8 peers of
`experiments.int8_peers`), and reports each file's per-round times (`times_ms`), its process
id and the runtimes it had loaded (`loaded`: only its own), so that a caller can pair any
two of its files (`median_ratio`) and check that each runtime ran alone.

Usage:
    python -m experiments.runtime_processes --torchvision DIR [--runtime openvino]
        [--processes 8] [--json rows.json]
    python -m experiments.runtime_processes --torchvision DIR --runtime litert
    python -m experiments.runtime_processes --files old=a.onnx new=b.onnx --processes 12
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
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


RUNTIMES = ("onnxruntime", "openvino", "litert")
# OpenVINO's inference precision (INFERENCE_PRECISION_HINT), as `export.openvino_config`
# (not imported: a child imports only its runtime): float32 unless --openvino-precision.
OPENVINO_PRECISIONS = ("f32", "bf16", "f16")
OPENVINO_PRECISION = "f32"


# Files whose name starts with this get NCHW input (torchvision's graphs), every other NHWC.
NCHW_PREFIX = "torchvision"
# The runtimes a child may load, as `sys.modules` names them (the row's `loaded`).
RUNTIME_MODULES = ("onnxruntime", "openvino", "ai_edge_litert", "torch", "tensorflow")


def _engine(runtime, path):
    """What runs `path` when timing `runtime`: LiteRT's files in LiteRT, TorchScript files in
    torch, ONNX files beside LiteRT's in ONNX Runtime."""
    if path.endswith(".tflite"):
        return "litert"
    if path.endswith(".pt"):
        return "torch"
    return "onnxruntime" if runtime == "litert" else runtime


def _calls(runtime, files, threads, x, precision=OPENVINO_PRECISION):
    """{name: a call running that file once} in `runtime` (NCHW input for names starting
    with "torchvision" and for TorchScript files; OpenVINO at the inference precision
    `precision`)."""
    calls = {}
    for name, path in files.items():
        engine = _engine(runtime, path)
        nchw = name.startswith(NCHW_PREFIX) or engine == "torch"
        inputs = x.transpose(0, 3, 1, 2).copy() if nchw else x
        if engine == "torch":
            import torch

            torch.set_num_threads(threads)
            if "x86" in torch.backends.quantized.supported_engines:
                torch.backends.quantized.engine = "x86"  # what the int8 peer was made for
            net, tensor = torch.jit.load(path), torch.from_numpy(inputs)

            def call(n=net, t=tensor, torch=torch):
                with torch.no_grad():
                    return n(t)

            calls[name] = call
        elif engine == "litert":
            from ai_edge_litert.interpreter import Interpreter

            interpreter = Interpreter(model_path=path, num_threads=threads)
            interpreter.allocate_tensors()
            into = interpreter.get_input_details()[0]["index"]
            out = interpreter.get_output_details()[0]["index"]

            def call(i=interpreter, a=inputs, into=into, out=out):
                i.set_tensor(into, a)
                i.invoke()
                return i.get_tensor(out)

            calls[name] = call
        elif engine == "onnxruntime":
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
            config = {
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": precision,
            }
            compiled = core.compile_model(model, "CPU", config)
            calls[name] = lambda c=compiled, a=inputs: c(a)
    return calls


def time_sessions(
    files,
    threads,
    rounds,
    calls,
    seed,
    side=224,
    runtime="onnxruntime",
    pause=0.0,
    warmup=0,
    precision=OPENVINO_PRECISION,
):
    """Per-round milliseconds per call of each file {name: path} in `runtime` (a `side` x
    `side` NHWC input, or NCHW for names starting with "torchvision" and TorchScript files),
    each round in a new random order,
    `pause` seconds and `warmup` untimed calls of the same file before each block of calls;
    OpenVINO at the inference precision `precision`."""
    if precision not in OPENVINO_PRECISIONS:
        raise ValueError(
            f"`precision` must be one of {list(OPENVINO_PRECISIONS)}. "
            f"Received: precision={precision!r}"
        )
    x = np.random.default_rng(0).normal(size=(1, side, side, 3)).astype("float32")
    functions = _calls(runtime, files, threads, x, precision)
    return measure(functions, rounds, number=calls, seed=seed, pause=pause, warmup=warmup)


def write_files(directory, torchvision_dir, runtime="onnxruntime"):
    """{name: path}: the package's manual and folded v2 1.0x with torchvision's weights, as
    `runtime` reads them, and torchvision's ONNX file; every output checked (see the module)."""
    from experiments import benchmark
    from keras_autoshuffle import export
    from keras_autoshuffle.applications import AutoShuffleNetV2

    torchvision = benchmark.load_torchvision(torchvision_dir)
    spec = (AutoShuffleNetV2, {"width": 1.0})
    variants = ("manual", "manual_folded")
    models = benchmark.build_variants("v2_1.0", spec, 224, 1000, variants, None, torchvision)
    nhwc = torchvision[2].transpose(0, 2, 3, 1).copy()
    writers = {
        "onnxruntime": (export.export_onnx, _runner_outputs, ".onnx"),
        "openvino": (openvino_xml, _openvino_outputs, ""),
        "litert": (export.export_litert, _runner_outputs, ".tflite"),
    }
    jobs = [(name, model, runtime) for name, model in models.items()]
    if runtime == "litert":  # the control, in ONNX Runtime beside LiteRT
        jobs.append((CONTROL, models["manual_folded"], "onnxruntime"))
    files = {}
    for name, model, engine in jobs:
        write, outputs, suffix = writers[engine]
        files[name] = write(model, f"{directory}/{name}{suffix}")
        diff = benchmark._max_diff(outputs(files[name], nhwc), torchvision[3])
        if not diff <= benchmark.OUTPUT_TOLERANCE:
            raise SystemExit(f"error: {name}'s {engine} file differs from torch by {diff:.3e}")
    files["torchvision"] = torchvision[0]
    engine = _engine(runtime, files["torchvision"])
    outputs = writers[engine][1]
    diff = benchmark._max_diff(outputs(files["torchvision"], torchvision[2]), torchvision[3])
    if not diff <= benchmark.OUTPUT_TOLERANCE:
        raise SystemExit(f"error: torchvision's file in {engine} differs from torch by {diff:.3e}")
    return files


def _runner_outputs(path, inputs):
    from keras_autoshuffle import export

    return export.open_runner(path).run(inputs)


def _openvino_outputs(path, inputs):
    """OpenVINO's outputs of the file at `path`, also of torchvision's `.onnx` file."""
    from keras_autoshuffle import export

    compiled = export.openvino_model(path, batch=len(inputs))
    return compiled(inputs)[compiled.outputs[0]]


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
# The folded ONNX file in ONNX Runtime, timed beside LiteRT (--runtime litert).
CONTROL = "manual_folded_onnx"


def ratios_of(files, against_first=False):
    """The ratios a child reports for its files: the package's (and the control's with
    --runtime litert), or each against the first (`against_first`: other files)."""
    if against_first:
        first, *others = files
        return tuple((name, first) for name in others)
    return RATIOS + (((CONTROL, "torchvision"),) if CONTROL in files else ())


def median_ratio(samples, a, b):
    """The median over rounds of the per-round time ratio a / b of one process's samples
    {name: [ms per round]} (the two files timed in the same rounds: paired)."""
    return float(np.median(np.asarray(samples[a]) / np.asarray(samples[b])))


def summary(processes):
    """{"a/b": (mean, low, high, n)} over the processes' medians of per-round ratios."""
    from scipy import stats

    table = {}
    for name in processes[0]["ratios"]:
        values = np.array([p["ratios"][name] for p in processes])
        low, high = stats.t.interval(0.95, len(values) - 1, values.mean(), stats.sem(values))
        table[name] = (float(values.mean()), float(low), float(high), len(values))
    return table


def run_child(
    runtime,
    files,
    threads,
    rounds,
    calls,
    seed,
    pause,
    side,
    warmup,
    against_first,
    precision=OPENVINO_PRECISION,
):
    """Times `files` {name: path} in a fresh process of `runtime` (`child`, importing only
    the runtime and NumPy, run from the repository's root); returns its row: median_ms,
    ratios, the runtime's version and, with OpenVINO, `openvino_precision` (`precision`)."""
    settings = (threads, rounds, calls, seed, pause, side, warmup, int(against_first), precision)
    command = [sys.executable, "-m", "experiments.runtime_processes", CHILD, runtime]
    command += [json.dumps(files), *(str(v) for v in settings)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=REPOSITORY)
    if done.returncode:
        raise SystemExit(f"error: timing {runtime} (process {seed}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(argv):
    runtime, files = argv[0], json.loads(argv[1])
    threads, rounds, calls, seed = (int(v) for v in argv[2:6])
    pause, side, warmup, against_first = float(argv[6]), int(argv[7]), int(argv[8]), argv[9] == "1"
    precision = argv[10]
    samples = time_sessions(
        files, threads, rounds, calls, seed, side, runtime, pause, warmup, precision
    )
    ratios = {f"{a}/{b}": median_ratio(samples, a, b) for a, b in ratios_of(files, against_first)}
    medians = {name: float(np.median(ms)) for name, ms in samples.items()}
    engines = {_engine(runtime, path) for path in files.values()}
    versions = {
        e: __import__("ai_edge_litert" if e == "litert" else e).__version__ for e in engines
    }
    if "openvino" in engines:
        versions["openvino_precision"] = precision
    facts = {
        "times_ms": samples,
        "pid": os.getpid(),
        "loaded": [m for m in RUNTIME_MODULES if m in sys.modules],
    }
    print(json.dumps({"median_ms": medians, "ratios": ratios, **versions, **facts}))


def _given_files(parser, pairs):
    """{name: absolute path} of --files' NAME=PATH pairs; argparse errors name a bad one."""
    files = {}
    for pair in pairs:
        name, _, path = pair.partition("=")
        if not name or not path or name in files:
            parser.error(f"--files takes distinct NAME=PATH pairs. Received: {pair!r}")
        if not os.path.exists(path):
            parser.error(f"--files: no such file. Received: {pair!r}")
        files[name] = os.path.abspath(path)
    if len(files) < 2:
        parser.error(f"--files needs at least two files. Received: files={pairs}")
    return files


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == CHILD:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--torchvision", metavar="DIR")
    given.add_argument(
        "--files", nargs="+", metavar="NAME=PATH", help="time these, each against the first"
    )
    parser.add_argument("--runtime", choices=RUNTIMES, default="onnxruntime")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls timed together")
    parser.add_argument(
        "--pause", type=float, default=None, help="seconds before each block (litert: 0.1, else 0)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed calls of a file before each of its blocks (default: --calls)",
    )
    parser.add_argument("--side", type=int, default=224, help="input images: side x side")
    parser.add_argument(
        "--openvino-precision",
        choices=OPENVINO_PRECISIONS,
        default=OPENVINO_PRECISION,
        help="OpenVINO's INFERENCE_PRECISION_HINT (default f32, whatever the CPU)",
    )
    parser.add_argument("--json", help="write the processes' rows and the summary here")
    args = parser.parse_args(argv)
    for name in ("processes", "threads", "rounds", "calls", "side"):
        if getattr(args, name) < (2 if name == "processes" else 1):
            parser.error(f"--{name} is too small. Received: {name}={getattr(args, name)}")
    if args.pause is None:
        args.pause = 0.1 if args.runtime == "litert" else 0.0
    if args.warmup is None:
        args.warmup = args.calls
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0. Received: warmup={args.warmup}")
    if not 0 <= args.pause <= 10:
        parser.error(f"--pause must be in [0, 10] seconds. Received: pause={args.pause}")
    if args.torchvision is not None and not os.path.isdir(args.torchvision):
        parser.error(f"--torchvision is not a folder. Received: torchvision={args.torchvision!r}")
    if args.torchvision is not None and args.side != 224:
        parser.error(
            f"--side applies to --files only (224 with --torchvision). Received: side={args.side}"
        )
    given = _given_files(parser, args.files) if args.files else None
    processes = []
    with tempfile.TemporaryDirectory() as directory:
        files = given or write_files(directory, args.torchvision, args.runtime)
        for seed in range(args.processes):
            settings = (args.threads, args.rounds, args.calls, seed, args.pause, args.side)
            row = run_child(
                args.runtime,
                files,
                *settings,
                args.warmup,
                given is not None,
                args.openvino_precision,
            )
            processes.append(row)
            print(json.dumps(processes[-1]), flush=True)
    table = summary(processes)
    if args.runtime == "openvino":
        print(f"# OpenVINO inference precision: {args.openvino_precision}")
    for name, (mean, low, high, n) in table.items():
        print(f"{name}: {mean:.3f} (95% t interval {low:.3f}-{high:.3f}, {n} processes)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"processes": processes, "summary": table, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
