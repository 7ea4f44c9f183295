"""int8 ShuffleNet v2 1.0x on a CPU: the package's files against torchvision's int8 peers,
side by side in one run (issue 42, item 3). Not in CI.

Two stages, because no one venv holds both TensorFlow and torch:

`write` (the project's venv) builds `ShuffleNetV2(1.0)` at 224 with 1000 classes (random
weights: no ImageNet download here; a file's speed does not depend on its values), folds it
(`folding.fold_model`) and writes it with `export.export_model(..., formats=("litert",
"onnx", "openvino"), quantize="int8")`, calibrated on `--calibration` real images
(scikit-learn's digits, upscaled to 224, gray to RGB, 0..255). With random weights the
int8 check's agreement is meaningless, so its limits are opened (the numbers are kept in
the rows). It saves the images as `calibration.npy` (NHWC float32, 0..255) for stage 2.

`measure` (a torch venv: torch, torchvision, onnx, onnxruntime, openvino, nncf,
ai-edge-litert) builds the peers from torchvision's `shufflenet_v2_x1_0` (the quantizable
variant, `quantize=False`, seeded random weights, inputs normalized as torchvision's):
  - torch_tv_int8: torch's eager flow (fused, `x86` qconfig and engine, calibrated on the
    same images);
  - ort_tv_int8: torchvision's float graph exported by `torch.onnx.export` and quantized by
    `onnxruntime.quantization.quantize_static` (QDQ, per-channel, same images);
  - ov_tv_int8: that ONNX file read by OpenVINO and quantized by `nncf.quantize`;
  - ort_tv_fp32: torchvision's float ONNX file in ONNX Runtime (context);
  - litert/ort/ov_our_int8 and _fp32: the files of stage 1 that exist.
Every runtime at 2 threads (torch.set_num_threads(2); ORT intra_op 2, inter_op 1; OpenVINO
INFERENCE_NUM_THREADS 2, latency hint, f32 precision hint for float files; LiteRT
num_threads 2). Each round times every runtime once in a rotated order: batch 1 (ms per
call over `--calls` calls after one untimed call) and batch 32 (ms per batch over 2 calls
after one untimed call). Every round's times are kept in the rows; the ratios are paired
(per-round time ratios, their geometric mean, a bootstrap 95% interval over rounds).

Usage:
    . .venv/bin/activate
    python -m experiments.int8_peers write --out runs/int8_peers [--calibration 300]
    . runs/torchvenv/bin/activate   # torch, torchvision, onnx, onnxruntime, openvino, nncf,
                                    # ai-edge-litert
    python experiments/int8_peers.py measure --out runs/int8_peers --rounds 12 \
        --json docs/results/int8_peers_cpu.json --note "..."
"""

import argparse
import datetime
import json
import os
import subprocess
import time

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


def _torchvision(images, onnx_path):
    """torchvision's float net, its torch int8 net and its float ONNX file."""
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
    return qnet


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


def _nncf_quantize(src, images):
    import nncf
    import openvino

    model = openvino.Core().read_model(src)
    data = nncf.Dataset([images[i : i + 1] for i in range(len(images))])
    return nncf.quantize(model, data, subset_size=len(images))


def _calls(name, target, batch):
    """A function running `target` once on a batch of `batch` inputs (NHWC 0..255 for our
    LiteRT file; NCHW for the graphs the runtime reads as NCHW)."""
    rng = np.random.default_rng(batch)
    if name.startswith("torch"):
        import torch

        x = torch.from_numpy(rng.normal(size=(batch, 3, SIDE, SIDE)).astype("float32"))

        def call():
            with torch.no_grad():
                return target(x)

        return call
    if name.startswith("litert"):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=target, num_threads=THREADS)
        detail = interpreter.get_input_details()[0]
        interpreter.resize_tensor_input(detail["index"], [batch, SIDE, SIDE, 3])
        interpreter.allocate_tensors()
        x = rng.uniform(0, 255, (batch, SIDE, SIDE, 3)).astype("float32")
        out = interpreter.get_output_details()[0]["index"]

        def call():
            interpreter.set_tensor(detail["index"], x)
            interpreter.invoke()
            return interpreter.get_tensor(out)

        return call
    if name.startswith("ort"):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(target, options, providers=["CPUExecutionProvider"])
        spec = session.get_inputs()[0]
        shape = [batch] + [d if isinstance(d, int) else SIDE for d in spec.shape[1:]]
        feed = {spec.name: rng.normal(size=shape).astype("float32")}
        return lambda: session.run(None, feed)
    import openvino

    core = openvino.Core()
    model = core.read_model(target) if isinstance(target, str) else target.clone()
    shape = [batch] + [d.get_length() for d in model.inputs[0].get_partial_shape()[1:]]
    model.reshape({model.inputs[0]: shape})
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": THREADS}
    if "fp32" in name:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(model, "CPU", config)
    x = rng.normal(size=shape).astype("float32")
    return lambda: compiled(x)


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


def _interval(times, a, b, draws=2000):
    """Geometric mean of the per-round time ratios a/b and its bootstrap 95% interval."""
    logs = np.log(np.asarray(times[a]) / np.asarray(times[b]))
    rng = np.random.default_rng(0)
    boot = rng.choice(logs, (draws, len(logs))).mean(axis=1)
    low, high = np.exp(np.percentile(boot, [2.5, 97.5]))
    return {"ratio": float(np.exp(logs.mean())), "low": float(low), "high": float(high)}


def _read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def measure(args):
    """Stage 2: the peers built, every target timed in interleaved rounds, rows written."""
    import torch

    torch.set_num_threads(THREADS)
    images = np.load(os.path.join(args.out, "calibration.npy"))
    tv_images = ((images - MEAN) / STD).transpose(0, 3, 1, 2).astype("float32").copy()
    failures = {}
    targets = {}
    tv_onnx = os.path.join(args.out, "tv_fp32.onnx")
    targets["torch_tv_int8"] = _torchvision(tv_images, tv_onnx)
    targets["ort_tv_fp32"] = tv_onnx
    try:
        _ort_quantize(tv_onnx, os.path.join(args.out, "tv_int8_qdq.onnx"), tv_images)
        targets["ort_tv_int8"] = os.path.join(args.out, "tv_int8_qdq.onnx")
    except Exception as error:  # reported in the rows, not hidden
        failures["ort_tv_int8"] = f"{type(error).__name__}: {error}"
    try:
        targets["ov_tv_int8"] = _nncf_quantize(tv_onnx, tv_images)
    except Exception as error:
        failures["ov_tv_int8"] = f"{type(error).__name__}: {error}"
    targets.update(_ours(args.out))
    calls = {}
    for name, target in targets.items():
        for batch in (1, 32):
            try:
                calls[(name, batch)] = _calls(name, target, batch)
                calls[(name, batch)]()
            except Exception as error:
                calls.pop((name, batch), None)
                failures[f"{name}@{batch}"] = f"{type(error).__name__}: {error}"[:500]
    names = list(targets)
    times = {key: [] for key in calls}
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            for batch, number in ((1, args.calls), (32, 2)):
                if (name, batch) not in calls:
                    continue
                call = calls[(name, batch)]
                call()
                start = time.perf_counter()
                for _ in range(number):
                    call()
                times[(name, batch)].append((time.perf_counter() - start) * 1e3 / number)
        print(f"round {round_ + 1}/{args.rounds}", flush=True)
    ratios = []
    for batch in (1, 32):
        per = {name: times[(name, batch)] for name in names if (name, batch) in times}
        for a, b in RATIOS:
            if a in per and b in per:
                ratios.append({"batch": batch, "a": a, "b": b, **_interval(per, a, b)})
            else:
                ratios.append({"batch": batch, "a": a, "b": b, "missing": True})
    import nncf
    import onnxruntime
    import openvino
    import torchvision

    row = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python experiments/int8_peers.py measure "
        f"--rounds {args.rounds} --calls {args.calls}",
        "note": args.note,
        "cpu": _cpu(),
        "threads": THREADS,
        "weights": "random (seeded); torchvision and ours differ",
        "calibration_images": int(len(images)),
        "versions": {
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "onnxruntime": onnxruntime.__version__,
            "openvino": openvino.__version__,
            "nncf": nncf.__version__,
        },
        "failures": failures,
        "export": _read_json(os.path.join(args.out, "export.json")),
        "median_ms": {f"{n}@{b}": float(np.median(t)) for (n, b), t in times.items() if len(t)},
        "times_ms": {f"{n}@{b}": t for (n, b), t in times.items()},
        "ratios": ratios,
    }
    rows = []
    if os.path.exists(args.json):
        with open(args.json) as f:
            rows = json.load(f)
    rows.append(row)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print(json.dumps({k: row[k] for k in ("cpu", "failures", "median_ms", "ratios")}, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("write", "measure"))
    parser.add_argument("--out", default="runs/int8_peers")
    parser.add_argument("--calibration", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=10, help="batch-1 calls per block")
    parser.add_argument("--json", default=os.path.join("docs", "results", "int8_peers_cpu.json"))
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    if args.stage == "write":
        write(args.out, args.calibration)
    else:
        measure(args)


if __name__ == "__main__":
    main()
