"""Training throughput of manual vs learned shuffles, on any Keras backend and device.

    KERAS_BACKEND=jax python -m experiments.train_throughput --input 224 --batch 128

Times `train_on_batch` on random data for ShuffleNet v1 (g=3) and v2 with the manual
shuffle, the relaxed shuffle (training an AutoShuffleNet; "relaxed_sinkhorn10" with ten
constraint passes per step), the hard forward pass started at the manual shuffle
("hard_sinkhorn10": the nearest permutation by linear assignment on the host at every
step, straight-through gradient) and the hardened one;
the variants are interleaved and repeated, the medians reported with the ratio to
manual. Uses only keras and the backend-neutral parts of the package, so it runs where
TensorFlow is not installed (e.g. a GPU machine with JAX).
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


VARIANTS = ("manual", "relaxed", "relaxed_sinkhorn10", "hard_sinkhorn10", "hardened")


def build(family, shuffle, input_size, classes, mixed):
    import keras

    from keras_autoshuffle import applications

    if mixed:
        keras.config.set_dtype_policy("mixed_bfloat16")
    builder = (
        applications.AutoShuffleNetV1 if family.startswith("v1") else applications.AutoShuffleNetV2
    )
    kwargs = {"groups": 3} if family.startswith("v1") else {}
    model = builder(
        width=float(family.rsplit("_", 1)[1]),
        input_shape=(input_size, input_size, 3),
        classes=classes,
        shuffle="manual" if shuffle == "manual" else "auto",
        sinkhorn_iterations=10 if shuffle.endswith("sinkhorn10") else 1,
        shuffle_initializer="manual" if shuffle.startswith("hard") else "random",
        shuffle_forward="hard" if shuffle.startswith("hard") else "relaxed",
        **kwargs,
    )
    if shuffle == "hardened":
        from keras_autoshuffle import harden_model

        harden_model(model)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss="sparse_categorical_crossentropy",
    )
    keras.config.set_dtype_policy("float32")
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["v1_g3_1.0", "v2_1.0", "v2_1.5"])
    parser.add_argument("--input", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the variants")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--mixed-precision", action="store_true", help="bfloat16 compute")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.input, args.input, 3)).astype("float32")
    y = rng.integers(0, 1000, size=(args.batch,))
    # On the device once: time the steps, not the host-to-device copy of the batch.
    x, y = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)
    variants = ("manual", *[v for v in args.variants if v != "manual"])
    models = {
        (m, v): build(m, v, args.input, 1000, args.mixed_precision)
        for m in args.models
        for v in variants
    }
    for model in models.values():  # warm-up: compile and first steps
        for _ in range(3):
            model.train_on_batch(x, y)
    times = {key: [] for key in models}
    for _ in range(args.repeats):
        for key, model in models.items():
            float(model.train_on_batch(x, y))  # sync before timing
            start = time.perf_counter()
            for _ in range(args.steps - 1):
                model.train_on_batch(x, y)
            float(model.train_on_batch(x, y))
            times[key].append((time.perf_counter() - start) / args.steps * 1000)
    rows = []
    print(f"backend {keras.backend.backend()}, input {args.input}, batch {args.batch}")
    print("| model | variant | median ms/step | images/s | ratio to manual |")
    print("|---|---|---|---|---|")
    for m in args.models:
        manual = float(np.median(times[(m, "manual")]))
        for v in variants:
            median = float(np.median(times[(m, v)]))
            rows.append(
                {
                    "model": m,
                    "variant": v,
                    "input": args.input,
                    "batch": args.batch,
                    "median_ms": median,
                    "backend": keras.backend.backend(),
                }
            )
            print(
                f"| {m} | {v} | {median:.2f} | {args.batch / median * 1000:.0f} "
                f"| {median / manual:.2f} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
