"""int8 ShuffleNet v2 1.0x on a CPU: the package's files against torchvision's int8 peers,
each runtime timed alone in fresh processes (issue 42, item 3; issue 53, item 3). Not in CI.

Two stages, because no one venv holds both TensorFlow and torch:

`write` (the project's venv) builds `ShuffleNetV2(1.0)` at 224 with 1000 classes (random
weights: no ImageNet download here; a file's speed does not depend on its values), folds it
(`folding.fold_model`) and writes it with `export.export_model(..., formats=("litert",
"onnx", "openvino"), quantize="int8")`, calibrated on `--calibration` real images
(scikit-learn's digits, upscaled to 224, gray to RGB, 0..255). With random weights the
int8 check's agreement is meaningless, so its limits are opened (the numbers are kept in
the rows). It saves the images as `calibration.npy` (NHWC float32, 0..255) for stage 2.

`measure` (a torch venv: torch, torchvision, onnx, onnxruntime, openvino, nncf, scipy,
ai-edge-litert) builds the peers from torchvision's `shufflenet_v2_x1_0` (the quantizable
variant, `quantize=False`, seeded random weights, inputs normalized as torchvision's) and
writes each as a file beside stage 1's:
  - torch_tv_int8: torch's eager flow (fused, `x86` qconfig and engine, calibrated on the
    same images), traced to TorchScript (`tv_int8_torch.pt`);
  - ort_tv_int8: torchvision's float graph exported by `torch.onnx.export` and quantized by
    `onnxruntime.quantization.quantize_static` (QDQ, per-channel, same images);
  - ov_tv_int8: that ONNX file read by OpenVINO, quantized by `nncf.quantize` and saved;
  - ort_tv_fp32: torchvision's float ONNX file in ONNX Runtime (context);
  - litert/ort/ov_our_int8 and _fp32: the files of stage 1 that exist.
Then each runtime is timed alone: per repeat (`--processes`), one fresh process per runtime
(`experiments.runtime_processes`' child: it imports that runtime and NumPy only), the
runtimes in a rotated order, each process timing its runtime's files in `--rounds` rounds of
`--calls` calls (a new random order each round, as many untimed calls of the same file
before each block), batch 1, 2 threads (torch.set_num_threads(2); ORT intra_op 2; OpenVINO
INFERENCE_NUM_THREADS 2, latency hint, f32 inference precision; LiteRT num_threads 2).
A ratio of two files of one runtime is the median of their per-round ratios in a process
(paired by round); of two runtimes (our LiteRT against torch), the ratio of the two
processes' medians in the same repeat; each is given as the mean over repeats with a 95% t
interval. The row records this `method` ("alone"); rows of the first runs (every runtime
timed in one process, interleaved rounds, batches 1 and 32) record "one_process": there
the runtimes' thread pools disturb each other (issue 53), and `page` says which of their
figures differ from the runtimes timed alone.

`page` prints the rows' table (docs/lab-notes/inference.md holds it between
`claims:int8-peers` markers: `python -m experiments.claims --write`).

Usage:
    . .venv/bin/activate
    python -m experiments.int8_peers write --out runs/int8_peers [--calibration 300]
    . runs/torchvenv/bin/activate   # torch, torchvision, onnx, onnxruntime, openvino, nncf,
                                    # ai-edge-litert
    python -m experiments.int8_peers measure --out runs/int8_peers --processes 3 \
        --json docs/results/int8_peers_cpu.json --note "..."
"""

import argparse
import datetime
import json
import os
import subprocess

import numpy as np

SIDE = 224
THREADS = 2
MEAN = np.array([0.485, 0.456, 0.406], "float32") * 255
STD = np.array([0.229, 0.224, 0.225], "float32") * 255
# (numerator, denominator) of each paired ratio.
RATIOS = (
    ("litert_our_int8", "torch_tv_int8"),
    ("ort_our_int8", "ort_tv_int8"),
    ("ov_our_int8", "ov_tv_int8"),
    ("litert_our_int8", "litert_our_fp32"),
    ("ort_our_int8", "ort_our_fp32"),
    ("ov_our_int8", "ov_our_fp32"),
    ("ort_tv_int8", "ort_tv_fp32"),
)


def write(out, count):
    """Stage 1: the folded net's float and int8 files and the calibration images."""
    import keras
    from sklearn.datasets import load_digits

    from keras_autoshuffle import applications, export, folding

    digits = load_digits()
    images = digits.images[:count, :, :, None] * (255 / 16)
    images = np.repeat(images, 3, axis=-1).astype("float32")
    images = keras.ops.convert_to_numpy(keras.ops.image.resize(images, (SIDE, SIDE)))
    labels = digits.target[:count]
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "calibration.npy"), images)
    keras.utils.set_random_seed(0)
    model = applications.ShuffleNetV2(1.0, input_shape=(SIDE, SIDE, 3), classes=1000)
    result = export.export_model(
        folding.fold_model(model),
        os.path.join(out, "ours"),
        images[:8],
        formats=("litert", "onnx", "openvino"),
        reference=model,
        quantize="int8",
        representative_data=images,
        test_data=(images[:100], labels[:100]),
        max_accuracy_drop=100.0,
    )
    with open(os.path.join(out, "export.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps(result, indent=1, default=str))


def _cpu():
    """lscpu's model name and the int8-relevant flags."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    keep = [f for f in flags if f.startswith(("avx512", "amx")) or "vnni" in f]
    return {"model_name": fields.get("Model name", "").strip(), "flags": keep}


def _torchvision(images, onnx_path, torch_path):
    """torchvision's float net written as an ONNX file, and its torch int8 net (eager flow)
    written as TorchScript."""
    import torch
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.quantization.shufflenet_v2_x1_0(weights=None, quantize=False)
    net.eval()
    torch.onnx.export(
        net,
        torch.from_numpy(images[:1]),
        onnx_path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
        opset_version=17,
        dynamo=False,
    )
    torch.backends.quantized.engine = "x86"
    qnet = torchvision.models.quantization.shufflenet_v2_x1_0(weights=None, quantize=False)
    qnet.load_state_dict(net.state_dict())
    qnet.eval()
    qnet.fuse_model(is_qat=False)
    qnet.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    torch.ao.quantization.prepare(qnet, inplace=True)
    with torch.no_grad():
        for start in range(0, len(images), 32):
            qnet(torch.from_numpy(images[start : start + 32]))
        torch.ao.quantization.convert(qnet, inplace=True)
        torch.jit.save(torch.jit.trace(qnet, torch.from_numpy(images[:1])), torch_path)


def _ort_quantize(src, dst, images):
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": images[i : i + 1]} for i in range(len(images))])

        def get_next(self):
            return next(self.batches, None)

    q.quantize_static(
        src, dst, Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
        activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
    )  # fmt: skip


def _nncf_quantize(src, dst, images):
    """torchvision's ONNX file quantized by NNCF, saved as an OpenVINO IR at `dst` (.xml)."""
    import nncf
    import openvino

    model = openvino.Core().read_model(src)
    data = nncf.Dataset([images[i : i + 1] for i in range(len(images))])
    quantized = nncf.quantize(model, data, subset_size=len(images))
    openvino.save_model(quantized, dst, compress_to_fp16=False)


def _ours(out):
    """{name: path} of stage 1's files that exist."""
    folder = os.path.join(out, "ours")
    candidates = {
        "litert_our_fp32": "model.tflite",
        "litert_our_int8": "model_int8.tflite",
        "ort_our_fp32": "model.onnx",
        "ort_our_int8": "model_int8.onnx",
        "ov_our_fp32": "openvino/model.xml",
        "ov_our_int8": "openvino_int8/model.xml",
    }
    paths = {n: os.path.join(folder, p) for n, p in candidates.items()}
    return {n: p for n, p in paths.items() if os.path.exists(p)}


def peer_files(out, tv_images):
    """{peer name: path} of every file to time (torchvision's peers written into `out`),
    and {peer name: why it is missing} for a peer that could not be made."""
    files, failures = {}, {}
    # (peers, their files, the peer whose file they are made from, how).
    makers = (
        (
            ("ort_tv_fp32", "torch_tv_int8"),
            ("tv_fp32.onnx", "tv_int8_torch.pt"),
            None,
            lambda paths: _torchvision(tv_images, *paths),
        ),
        (
            ("ort_tv_int8",),
            ("tv_int8_qdq.onnx",),
            "ort_tv_fp32",
            lambda paths: _ort_quantize(files["ort_tv_fp32"], paths[0], tv_images),
        ),
        (
            ("ov_tv_int8",),
            ("tv_int8_nncf.xml",),
            "ort_tv_fp32",
            lambda paths: _nncf_quantize(files["ort_tv_fp32"], paths[0], tv_images),
        ),
    )
    for names, file_names, source, make in makers:
        if source is not None and source not in files:
            failures.update(dict.fromkeys(names, f"not made: {source} is missing"))
            continue
        paths = [os.path.join(out, name) for name in file_names]
        try:
            make(paths)
            files.update(zip(names, paths, strict=True))
        except Exception as error:  # reported in the rows, not hidden
            failures.update(dict.fromkeys(names, f"{type(error).__name__}: {error}"[:500]))
    files.update(_ours(out))
    return files, failures


# -- timing: each runtime alone, in fresh processes -------------------------------------

# A peer's name starts with its runtime's prefix; the runtime as
# experiments.runtime_processes' children name it.
RUNTIMES = {"torch": "torch", "litert": "litert", "ort": "onnxruntime", "ov": "openvino"}
# How a row's times were taken (its "method": the first two runs' is "one_process").
METHODS = {
    "one_process": "every runtime in one process, interleaved rounds",
    "alone": "each runtime alone, one fresh process per runtime and repeat",
}


def child_name(peer):
    """The name a child times `peer` under: "torchvision_<kind>" (NCHW input, see
    `runtime_processes.NCHW_PREFIX`) or "ours_<kind>"."""
    prefix, source, kind = peer.split("_")
    return f"{'torchvision' if source == 'tv' else 'ours'}_{kind}"


def peer_name(runtime, child):
    """The peer a child's file name stands for in `runtime` (`child_name`'s inverse)."""
    (prefix,) = [p for p, r in RUNTIMES.items() if r == runtime]
    source, kind = child.split("_")
    return f"{prefix}_{'tv' if source == 'torchvision' else 'our'}_{kind}"


def time_alone(files, processes, rounds, calls, side=SIDE, threads=THREADS):
    """Process rows: per repeat, each runtime's files {peer: path} timed in one fresh process
    of that runtime (`runtime_processes.run_child`; the runtimes in a rotated order); each
    row with its "runtime" and "repeat" added to the child's (median_ms, times_ms, pid,
    loaded, versions)."""
    from experiments.runtime_processes import run_child

    groups = {}
    for peer, path in files.items():
        runtime = RUNTIMES[peer.split("_")[0]]
        groups.setdefault(runtime, {})[child_name(peer)] = os.path.abspath(path)
    runtimes, rows = list(groups), []
    for repeat in range(processes):
        shift = repeat % len(runtimes)
        for runtime in runtimes[shift:] + runtimes[:shift]:
            settings = (threads, rounds, calls, repeat, 0.0, side, calls)
            row = run_child(runtime, groups[runtime], *settings, against_first=True)
            rows.append({"runtime": runtime, "repeat": repeat, **row})
    return rows


def _mean_interval(values):
    """{"ratio", "low", "high", "processes"}: the mean of `values` and its 95% t interval
    (None bounds for fewer than two)."""
    from experiments.runtime_processes import summary

    if len(values) < 2:
        return {"ratio": float(np.mean(values)), "low": None, "high": None, "processes": 1}
    mean, low, high, n = summary([{"ratios": {"r": v}} for v in values])["r"]
    return {"ratio": mean, "low": low, "high": high, "processes": n}


def peer_ratios(rows):
    """Each of RATIOS at batch 1 over the process rows of `time_alone`: two files of one
    runtime paired by round in each process (`runtime_processes.median_ratio`), two
    runtimes by the two processes' medians in the same repeat; the mean over repeats with
    its 95% t interval, or "missing" where a file was not timed."""
    from experiments.runtime_processes import median_ratio

    medians = {}  # repeat -> {peer: median ms}
    for row in rows:
        for child, ms in row["median_ms"].items():
            medians.setdefault(row["repeat"], {})[peer_name(row["runtime"], child)] = ms
    ratios = []
    for a, b in RATIOS:
        same = RUNTIMES[a.split("_")[0]] == RUNTIMES[b.split("_")[0]]
        if same:
            values = [
                median_ratio(row["times_ms"], child_name(a), child_name(b))
                for row in rows
                if row["runtime"] == RUNTIMES[a.split("_")[0]]
                and {child_name(a), child_name(b)} <= set(row["times_ms"])
            ]
        else:
            values = [m[a] / m[b] for m in medians.values() if a in m and b in m]
        entry = {"batch": 1, "a": a, "b": b, "paired": "round" if same else "repeat"}
        ratios.append({**entry, **_mean_interval(values)} if values else {**entry, "missing": True})
    return ratios


def _read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _versions():
    """{module: version} of the peers' packages (None where one is not installed: its
    peers are then missing, and the row's failures say why)."""
    import importlib

    versions = {}
    for name in ("torch", "torchvision", "onnxruntime", "openvino", "nncf", "ai_edge_litert"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except ImportError:
            versions[name] = None
    return versions


def measure(args):
    """Stage 2: the peers written, each runtime timed alone in fresh processes, a row
    appended to `args.json`."""
    images = np.load(os.path.join(args.out, "calibration.npy"))
    tv_images = ((images - MEAN) / STD).transpose(0, 3, 1, 2).astype("float32").copy()
    files, failures = peer_files(args.out, tv_images)
    processes = time_alone(files, args.processes, args.rounds, args.calls)
    median_ms = {}
    for row in processes:
        for child, ms in row["median_ms"].items():
            median_ms.setdefault(f"{peer_name(row['runtime'], child)}@1", []).append(ms)
    row = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m experiments.int8_peers measure "
        f"--processes {args.processes} --rounds {args.rounds} --calls {args.calls}",
        "method": "alone",
        "processes_per_runtime": args.processes,
        "note": args.note,
        "cpu": _cpu(),
        "threads": THREADS,
        "weights": "random (seeded); torchvision and ours differ",
        "calibration_images": int(len(images)),
        "versions": _versions(),
        "failures": failures,
        "export": _read_json(os.path.join(args.out, "export.json")),
        # The median over processes of each process's median (ms per call, batch 1).
        "median_ms": {key: float(np.median(values)) for key, values in median_ms.items()},
        "processes": processes,
        "ratios": peer_ratios(processes),
    }
    rows = _read_json(args.json) or []
    rows.append(row)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print(json.dumps({k: row[k] for k in ("cpu", "failures", "median_ms", "ratios")}, indent=1))


# -- the page ----------------------------------------------------------------------------

# The table's columns: (numerator, denominator) of a ratio at batch 1, and its header.
COLUMNS = {
    ("litert_our_int8", "litert_our_fp32"): "ours, int8 / float: LiteRT",
    ("ort_our_int8", "ort_our_fp32"): "ONNX Runtime",
    ("ov_our_int8", "ov_our_fp32"): "OpenVINO",
    ("litert_our_int8", "torch_tv_int8"): "our int8 / torchvision's: LiteRT / torch",
    ("ort_our_int8", "ort_tv_int8"): "ONNX Runtime",
    ("ov_our_int8", "ov_tv_int8"): "OpenVINO",
    ("ort_tv_int8", "ort_tv_fp32"): "torchvision's, int8 / float: ONNX Runtime",
}


def _cpu_label(row):
    """The row's CPU with its speed features ("AMD EPYC (no AVX-512)"): two rows are on the
    same CPU when their labels agree."""
    from keras_autoshuffle.finetuning.metrics import describe_cpu

    return describe_cpu(row["cpu"]["model_name"], row["cpu"]["flags"])


def _ratio(entry):
    if entry is None or entry.get("missing"):
        return None
    if entry.get("low") is None:
        return f"{entry['ratio']:.2f}"
    return f"{entry['ratio']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"


def _batch1(row):
    return {(r["a"], r["b"]): r for r in row["ratios"] if r["batch"] == 1}


def render(rows):
    """The peers' rows as a table at batch 1, each row's method and CPU named. A ratio of a
    row timed in one process is marked distorted where its 95% interval excludes the same
    ratio of the latest row timed with each runtime alone on the same CPU (same model and
    speed features): the same files' timing, changed by nothing but the method."""
    header = "| run | CPU | method | " + " | ".join(COLUMNS.values()) + " |"
    lines = [
        "Time ratios at batch 1, ShuffleNet v2 1.0x at 224, random weights, 2 threads "
        "(rows: [int8_peers_cpu.json](../results/int8_peers_cpu.json); mean, or geometric "
        "mean, [95% interval]):",
        "",
        header,
        "|" + "---|" * (3 + len(COLUMNS)),
    ]
    alone = {}  # CPU label -> (run number, batch-1 ratios) of its latest row timed alone
    for number, row in enumerate(rows, start=1):
        if row["method"] == "alone":
            alone[_cpu_label(row)] = (number, _batch1(row))
    marked, unchecked = [], []
    for number, row in enumerate(rows, start=1):
        reference = alone.get(_cpu_label(row)) if row["method"] == "one_process" else None
        if row["method"] == "one_process" and reference is None:
            unchecked.append(number)
        cells = []
        for pair, entry in ((pair, _batch1(row).get(pair)) for pair in COLUMNS):
            text = _ratio(entry)
            other = reference and reference[1].get(pair)
            if text and other and not other.get("missing"):
                if not entry["low"] <= other["ratio"] <= entry["high"]:
                    text += " (distorted)"
                    marked.append((number, " / ".join(pair), other["ratio"], reference[0]))
            cells.append(text or "-")
        lines.append(
            f"| {number} ({row['date'][:10]}) | {_cpu_label(row)} "
            f"| {METHODS[row['method']]} | " + " | ".join(cells) + " |"
        )
    old = [n for n, row in enumerate(rows, start=1) if row["method"] == "one_process"]
    if old:
        words = "; ".join(
            f"run {n}'s {name} against {value:.2f} in run {m}" for n, name, value, m in marked
        )
        lines += [
            "",
            f"Runs {', '.join(map(str, old))} timed every runtime in one process, where the "
            "runtimes' thread pools may disturb each other. Distorted: a ratio whose interval "
            "excludes the same ratio timed with each runtime alone in fresh processes on the "
            "same CPU"
            + (f": {words}." if words else ": none." if len(unchecked) < len(old) else ".")
            + (
                f" Runs {', '.join(map(str, unchecked))}: no run timed alone on their CPU, so "
                "not claims."
                if unchecked
                else ""
            ),
        ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("write", "measure", "page"))
    parser.add_argument("--out", default="runs/int8_peers")
    parser.add_argument("--calibration", type=int, default=300)
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per runtime")
    parser.add_argument("--rounds", type=int, default=30, help="rounds in each process")
    parser.add_argument("--calls", type=int, default=20, help="batch-1 calls per block")
    parser.add_argument("--json", default=os.path.join("docs", "results", "int8_peers_cpu.json"))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    for name in ("calibration", "processes", "rounds", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {name}={getattr(args, name)}")
    if args.stage == "write":
        write(args.out, args.calibration)
    elif args.stage == "measure":
        measure(args)
    else:
        print(render(_read_json(args.json) or []))
    return 0


if __name__ == "__main__":
    main()
