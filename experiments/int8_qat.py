"""The quantization-aware lever (issue 53, item 2): a short training phase of the folded
float net with its int8 rounding simulated, then the runtimes' ordinary post-training
int8 files from the same calibration images, measured beside the default files of the
same nets.

The phase (`quantization_aware`): each convolution, depthwise convolution and dense
kernel is rounded per output channel to symmetric int8 in the forward pass (LiteRT's
weight scheme; `--weight-bits 7` for ONNX Runtime's and OpenVINO's default 7-bit
weights), the gradient passing straight through (w + stop_gradient(q(w) - w)); each
activation the int8 files keep as a tensor of its own (after a ReLU, a BatchNormalization
not followed by one, a concatenation, the pooling) is rounded per tensor to uint8 over its
min/max on the calibration images (`FakeQuant`). BatchNormalization stays frozen as in
the fine-tune, so the per-channel rounding of the kernel is that of the kernel the
converters fuse with it (a positive or negative per-channel scale commutes with
symmetric per-channel rounding). SGD with momentum 0.9 at a constant rate, label
smoothing 0.1, the run's own training images and augmentation. The float weights are then
copied into the folded net (its architecture unchanged) and exported as the default is.

Rows (one per net, runtime and setting: "default", the folded net as trained; "qat")
go to `--rows` as JSON lines as they are measured, each "qat" row with the phase's
parameters (`qat`), the float accuracy before it (`original_float_accuracy`), the change
(`float_accuracy_change`, points) and the top-1 agreement of the two float nets. A rerun
skips the nets it holds. The summary pairs by net (`int8_levers.summarize`).

Usage:
    python -m experiments.int8_qat transfer --results docs/results/transfer_int8 \
        --work runs/transfer_int8 [--epochs 3 --learning-rate 0.002] [--table]
    python -m experiments.int8_qat fashion-mnist --model runs/fm_v2/model.keras \
        --rows docs/results/int8_qat_fashion_mnist.jsonl --seeds 0 1 2 3 4
"""

import argparse
import json
import math
import os
import tempfile

import keras
import numpy as np
from keras import layers, ops

from experiments.transfer_study import QAT_FILE

RUNTIMES = ("litert", "onnx", "openvino")


def fake_quantize_kernel(kernel, depthwise: bool = False, bits: int = 8):
    """`kernel` rounded per output channel to symmetric `bits`-bit integers and back
    (scale max|w| / (2^(bits-1) - 1), levels -(2^(bits-1) - 1) .. 2^(bits-1) - 1).

    Args:
        kernel: a Conv2D / Dense kernel (output channels last) or a DepthwiseConv2D kernel
            (kh, kw, channels, multiplier: output channel = channel x multiplier).
        depthwise: whether `kernel` is a depthwise kernel.
        bits: the integer width, 2-8.
    """
    shape = ops.shape(kernel)
    channels = shape[-2] * shape[-1] if depthwise else shape[-1]
    flat = ops.reshape(kernel, (-1, channels))
    bound = ops.maximum(ops.max(ops.abs(flat), axis=0), 1e-12)
    rounded = keras.quantizers.fake_quant_with_min_max_vars(
        flat, -bound, bound, num_bits=bits, narrow_range=True, axis=-1
    )
    return ops.reshape(rounded, shape)


@keras.saving.register_keras_serializable(package="experiments")
class FakeQuant(layers.Layer):
    """Rounds its input per tensor to `2^bits` levels over [low, high] (uint8 as the
    int8 files' activations, zero exactly representable) and back; the gradient passes
    straight through inside the range.

    Args:
        low: the range's lower end (a calibration minimum).
        high: its upper end.
        bits: the integer width.
    """

    def __init__(self, low: float, high: float, bits: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.low, self.high, self.bits = float(min(low, 0.0)), float(max(high, 0.0)), int(bits)

    def call(self, inputs):
        if self.high <= self.low:  # a constant zero tensor: nothing to round
            return inputs
        return keras.quantizers.fake_quant_with_min_max_vars(
            inputs, self.low, self.high, num_bits=self.bits
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "low": self.low, "high": self.high, "bits": self.bits}


def _producers(layer_config: dict) -> list[str]:
    """The names of the layers whose outputs `layer_config` (a functional model's layer
    entry) takes."""
    names = []

    def walk(item):
        if isinstance(item, dict):
            history = item.get("config", {}).get("keras_history") if "config" in item else None
            if isinstance(history, list):
                names.append(history[0])
                return
            for value in item.values():
                walk(value)
        elif isinstance(item, (list, tuple)):
            for value in item:
                walk(value)

    walk(layer_config.get("inbound_nodes", []))
    return names


def _is_linear(layer) -> bool:
    return getattr(getattr(layer, "activation", None), "__name__", "linear") == "linear"


def quantized_activations(model: keras.Model) -> list[str]:
    """The layers of `model` whose outputs the int8 files hold as int8 tensors of their
    own: the converters fuse a convolution or dense layer with the BatchNormalization
    after it and a BatchNormalization with the ReLU after it; slices, splits and padding
    keep their input's scale; a dense layer with a softmax inside is left out."""
    consumers = {}
    for entry in model.get_config()["layers"]:
        for producer in _producers(entry):
            consumers.setdefault(producer, set()).add(entry["class_name"])
    chosen = []
    for layer in model.layers:
        after = consumers.get(layer.name, set())
        if isinstance(layer, (layers.ReLU, layers.Concatenate, layers.GlobalAveragePooling2D)):
            chosen.append(layer.name)
        elif isinstance(layer, layers.BatchNormalization) and after != {"ReLU"}:
            chosen.append(layer.name)
        elif isinstance(layer, (layers.Conv2D, layers.DepthwiseConv2D, layers.Dense)):
            if after != {"BatchNormalization"} and _is_linear(layer):
                chosen.append(layer.name)
    return chosen


def _ranges(model, names, images, batch_size=256):
    """{layer name: (min, max)} of the layers' outputs on `images`."""
    probe = keras.Model(model.inputs, [model.get_layer(n).output for n in names])
    outputs = probe.predict(images, batch_size=batch_size, verbose=0)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    return {n: (float(np.min(o)), float(np.max(o))) for n, o in zip(names, outputs, strict=True)}


def check_arguments(epochs: int, learning_rate: float, weight_bits: int) -> None:
    """Raises ValueError naming the first bad argument and its value."""
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
        raise ValueError(f"`epochs` must be an integer >= 1. Received: epochs={epochs!r}")
    if (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float, np.floating))
        or not math.isfinite(learning_rate)
        or learning_rate <= 0
    ):
        raise ValueError(
            "`learning_rate` must be a finite positive number. "
            f"Received: learning_rate={learning_rate!r}"
        )
    if weight_bits not in (7, 8):
        raise ValueError(f"`weight_bits` must be 7 or 8. Received: weight_bits={weight_bits!r}")


def fake_quantized_clone(
    folded: keras.Model, calibration: np.ndarray, rounded: bool = True
) -> keras.Model:
    """A copy of `folded` (its weights copied, BatchNormalization frozen) with a
    `FakeQuant` after each of its `quantized_activations`, ranged on `calibration` (none
    unless `rounded`)."""
    names = set(quantized_activations(folded)) if rounded else set()
    ranges = _ranges(folded, sorted(names), calibration) if names else {}

    def call_function(layer, *args, **kwargs):
        outputs = layer(*args, **kwargs)
        if layer.name in names:
            outputs = FakeQuant(*ranges[layer.name], name=f"{layer.name}_fake_quant")(outputs)
        return outputs

    clone = keras.models.clone_model(folded, call_function=call_function)
    for layer in folded.layers:
        if layer.weights:
            twin = clone.get_layer(layer.name)
            twin.set_weights(layer.get_weights())
            twin.trainable = not isinstance(twin, layers.BatchNormalization)
    return clone


def quantization_aware(
    folded: keras.Model,
    train,
    calibration: np.ndarray,
    epochs: int = 3,
    learning_rate: float = 0.002,
    weight_bits: int = 8,
    batch_size: int = 32,
    rounded: bool = True,
) -> keras.Model:
    """A copy of the folded float net `folded` (same config) trained `epochs` epochs of
    `train` (an `EpochData`: its own order and augmentation) with its int8 rounding
    simulated (module docstring); activation ranges from `calibration`. TensorFlow
    backend (the training step's tape). `rounded=False`: the same phase without any
    rounding (the control: more training alone)."""
    import tensorflow as tf

    check_arguments(epochs, learning_rate, weight_bits)
    clone = fake_quantized_clone(folded, calibration, rounded)
    kernels = {
        id(layer.kernel): isinstance(layer, layers.DepthwiseConv2D)
        for layer in clone.layers
        if rounded and isinstance(layer, (layers.Conv2D, layers.DepthwiseConv2D, layers.Dense))
    }
    trainable, fixed = clone.trainable_variables, clone.non_trainable_variables
    depthwise = [kernels.get(id(v)) for v in trainable]  # None: not a kernel
    optimizer = keras.optimizers.SGD(learning_rate, momentum=0.9)
    optimizer.build(trainable)
    from_logits = _is_linear(folded.layers[-1])
    loss_function = keras.losses.CategoricalCrossentropy(from_logits, label_smoothing=0.1)
    classes = folded.output_shape[-1]

    @tf.function
    def step(images, labels):
        values = [v.value for v in trainable]
        with tf.GradientTape() as tape:
            tape.watch(values)
            used = [
                v
                if d is None
                else v + ops.stop_gradient(fake_quantize_kernel(v, d, weight_bits) - v)
                for v, d in zip(values, depthwise, strict=True)
            ]
            outputs, _ = clone.stateless_call(used, [v.value for v in fixed], images, training=True)
            loss = loss_function(ops.one_hot(labels, classes), outputs)
        optimizer.apply(tape.gradient(loss, values), trainable)
        return loss

    for epoch in range(epochs):
        for images, labels in train.epoch_dataset(1000 + epoch, batch_size):
            step(images, labels)
    trained = keras.Model.from_config(folded.get_config())
    for layer in trained.layers:
        if layer.weights:
            layer.set_weights(clone.get_layer(layer.name).get_weights())
    return trained


def _accuracy(outputs, labels):
    return float(np.mean(np.argmax(outputs, -1) == labels))


def measure_net(name, model, trained, calibration, test, qat, extra=None, setting="qat"):
    """The rows of one net: each runtime's int8 file of the folded `model` ("default")
    and of `trained` (`setting`: "qat", or "float_phase", the control without rounding,
    whose run does not measure the default again; the phase's parameters `qat`), checked
    on `test` against its own float net; LiteRT's as finetune writes it
    (`int8_transfer_levers.litert_inputs`)."""
    from experiments import int8_levers, int8_transfer_levers
    from experiments.int8_accuracy import _row
    from keras_autoshuffle import folding
    from keras_autoshuffle.export import int8

    images, labels = test
    outputs = {
        s: m.predict(images, batch_size=256, verbose=0)
        for s, m in (("default", model), (setting, trained))
    }
    accuracy = {s: _accuracy(o, labels) for s, o in outputs.items()}
    change = {
        "qat": qat,
        "original_float_accuracy": accuracy["default"],
        "float_accuracy_change": 100 * (accuracy[setting] - accuracy["default"]),
        "float_agreement": float(
            np.mean(outputs[setting].argmax(-1) == outputs["default"].argmax(-1))
        ),
    }
    base = {"net": name, "test_images": len(labels), "calibration_images": len(calibration)}
    rows = []
    folded = folding.fold_model(model, name=model.name)
    measured = [("default", folded, model)] if setting == "qat" else []
    for kind, net, reference in [*measured, (setting, trained, trained)]:
        files = int8_levers.Files(net, reference, images)
        lite_net, lite_float, lite_calibration, lite_images = int8_transfer_levers.litert_inputs(
            net, reference, calibration, images
        )
        for runtime in RUNTIMES:
            if runtime == "litert":
                with tempfile.TemporaryDirectory() as folder:
                    entry = int8._export_int8_checked(
                        lite_net,
                        os.path.join(folder, "int8.tflite"),
                        lite_float or files.paths["litert"],
                        lite_calibration,
                        lite_images,
                        labels,
                        outputs[kind],
                        100.0,  # never refused: every file is measured
                    )
            else:
                entry = int8_levers.measure(
                    runtime, "7bit", files, net, calibration, test, outputs[kind]
                )
            row = {**_row(name, runtime, entry), "setting": kind, **base, **(extra or {})}
            row.update({k: v for k, v in entry.items() if k.startswith("avx2_")})
            if kind != "default":
                drop = 100 * (accuracy["default"] - entry["accuracy"])
                row.update({**change, "drop_from_original_float": drop})
            row["load_1min"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON-lines file (none where it is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _append(path, rows):
    from experiments.scale_study import append_row

    for row in rows:
        append_row(path, row)


def _phase(qat, train):
    """The phase's parameters as a row records them."""
    return {
        **qat,
        "batch_size": 32,
        "train_images": train.num_examples,
        "activations": qat["rounded"],
    }


def run_transfer(args, qat):
    """Each finished transfer net of the study without rows in `--rows`."""
    from experiments import int8_transfer_levers
    from experiments.transfer_study import PLAN_FILE, ROWS_FILE
    from experiments.transfer_study import read_rows as study_rows
    from keras_autoshuffle import folding

    rows_path = args.rows or os.path.join(args.results, QAT_FILE)
    with open(os.path.join(args.results, PLAN_FILE)) as f:
        plan = json.load(f)
    setting = "qat" if qat["rounded"] else "float_phase"
    done = {r["net"] for r in read_rows(rows_path) if r["setting"] == setting}
    for row in study_rows(os.path.join(args.results, ROWS_FILE), plan["plan"]):
        if row["arm"] != "transfer" or row["name"] in done:
            continue
        if args.nets and row["name"] not in args.nets:
            continue
        run_folder = os.path.join(args.work, "runs", row["name"])
        images_root = os.path.join(
            args.work, "folders", f"target_{row['per_class']}_seed{row['seed']}"
        )
        model, calibration, test = int8_transfer_levers.net_data(
            run_folder, plan["settings"], images_root
        )
        train, _ = int8_transfer_levers.run_split(run_folder, plan["settings"], images_root)
        folded = folding.fold_model(model, name=model.name)
        trained = quantization_aware(folded, train, calibration, **qat)
        extra = {"per_class": row["per_class"], "study_seed": row["seed"], **args.machine}
        phase = _phase(qat, train)
        _append(
            rows_path,
            measure_net(row["name"], model, trained, calibration, test, phase, extra, setting),
        )
    return rows_path


def run_fashion_mnist(args, qat):
    """The Fashion-MNIST net per seed: the phase on `--train-images` training images
    (that seed's order and augmentation), calibrated on `--calibration` images drawn
    with the seed (as `int8_levers`)."""
    from experiments import int8_levers
    from keras_autoshuffle import data

    model, train, images, labels, folded = int8_levers.study_net(args.model, args.test_images)
    setting = "qat" if qat["rounded"] else "float_phase"
    done = {r["seed"] for r in read_rows(args.rows) if r["setting"] == setting}
    for seed in args.seeds:
        if seed in done:
            continue
        pick = np.random.default_rng(seed).choice(len(train.images), args.calibration, False)
        calibration = train.images[np.sort(pick)]
        augmented, _ = data.fashion_mnist(seed=seed, augment=True)
        phase_data = augmented.subset(args.train_images)
        keras.utils.set_random_seed(seed)
        trained = quantization_aware(folded, phase_data, calibration, **qat)
        phase = _phase(qat, phase_data)
        test = (images, labels)
        rows = measure_net(
            f"seed{seed}", model, trained, calibration, test, phase, args.machine, setting
        )
        _append(
            args.rows, [{**r, "seed": seed, "model": os.path.abspath(args.model)} for r in rows]
        )
    return args.rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=("transfer", "fashion-mnist"))
    parser.add_argument("--results", help="transfer: the study's results folder")
    parser.add_argument("--work", help="transfer: its --work folder (the runs)")
    parser.add_argument("--model", help="fashion-mnist: the trained model.keras")
    parser.add_argument("--rows", help=f"JSON-lines rows (transfer: <results>/{QAT_FILE})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--calibration", type=int, default=500)
    parser.add_argument("--test-images", type=int, default=10000)
    parser.add_argument("--train-images", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--weight-bits", type=int, default=8)
    parser.add_argument(
        "--control",
        action="store_true",
        help='the same phase without rounding ("float_phase": more training alone)',
    )
    parser.add_argument("--nets", nargs="+", help="transfer: only these nets (names)")
    parser.add_argument("--table", action="store_true", help="print the summary, measure nothing")
    args = parser.parse_args(argv)
    if args.study == "transfer" and not (args.results and (args.work or args.table)):
        parser.error("transfer needs --results (and --work unless --table)")
    if args.study == "fashion-mnist" and not args.rows:
        parser.error("fashion-mnist needs --rows")
    path = args.rows or os.path.join(args.results, QAT_FILE)
    if not args.table:
        qat = {
            "epochs": args.epochs,
            "learning_rate": args.learning_rate,
            "weight_bits": args.weight_bits,
        }
        try:
            check_arguments(**qat)
            qat["rounded"] = not args.control
        except ValueError as error:
            parser.error(str(error))
        from experiments.transfer_study import code_version
        from keras_autoshuffle.finetuning.report import cpu_name

        # The code's commit read once, before this run's rows make the checkout dirty.
        args.machine = {"cpu": cpu_name(), "code": code_version()}
        path = run_transfer(args, qat) if args.study == "transfer" else run_fashion_mnist(args, qat)
    from experiments.transfer_int8 import qat_table

    print("\n".join(qat_table(read_rows(path))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
