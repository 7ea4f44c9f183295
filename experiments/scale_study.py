"""Manual vs learned shuffles at scale: full Fashion-MNIST, any Keras backend (a GPU with JAX).

    KERAS_BACKEND=jax python -m experiments.scale_study --epochs 100 --rows rows.jsonl

The study (`experiments/study.py`) needs TensorFlow and trains one run at a time on the
CPU; this one trains ShuffleNet v2 on all 60,000 training images with `model.fit` on
NumPy arrays, so it runs where only Keras and JAX are installed. The arms, each by seed:

- `manual`: the hand-made shuffle.
- `paper`: Algorithm 1 (random start, one constraint pass per step, the l1-2 penalty),
  rounded to the nearest permutations at the end (`harden_model`).
- `search_retrain`: the paper's start searched for `--search-epochs`, hardened, then the
  net of the manual run's initial weights trained with those permutations fixed.

Every run (arm x seed) is its own process, all at once: a net this small leaves a large
GPU idle between kernels. Each appends its row to `--rows` (JSON lines) when it ends, so
a stopped study keeps its finished runs and a rerun trains only the runs without a row
(rows of other settings are refused); `--summary` prints the paired comparison of the
rows (each arm minus manual, by seed, with a 95% t interval). `--time-budget S` fits the
study into S seconds (a lease of a GPU machine): every run first trains 2 epochs (rows in
`<rows>.calibration`), then the study trains the most epochs, at most `--epochs`, that
those timings say end in time.
Recipe: SGD with momentum 0.9, the learning rate decaying linearly to 0 over the run
(`LinearCycles`), weight decay 1e-4 coupled as in PyTorch (shuffle matrices excluded), zero
padding by 2 then a random 28x28 crop and a random horizontal flip, as the study's data.
"""

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time

import numpy as np

ARMS = ("manual", "paper", "search_retrain")
MEAN, STD = 0.2860, 0.3530  # keras_autoshuffle.data.FASHION_MNIST_MEAN/STD (no TensorFlow here)


def load_arrays(max_train_examples=None):
    """Fashion-MNIST through Keras's loader (its cache, ~/.keras/datasets/fashion-mnist),
    normalised like the study's, as float32 (n, 28, 28, 1) and int32 labels."""
    import keras

    (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()

    def scale(images):
        return ((images[..., None].astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32)

    n = max_train_examples or len(x_train)
    return scale(x_train[:n]), y_train[:n].astype(np.int32), scale(x_test), y_test.astype(np.int32)


def pad_crop_flip(padded, rng, size=28):
    """A random `size` x `size` crop of each zero-padded image, mirrored with probability 1/2."""
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))
    n, room = len(padded), padded.shape[1] - size + 1
    dy, dx = rng.integers(0, room, n), rng.integers(0, room, n)
    crops = np.moveaxis(windows[np.arange(n), dy, dx], 1, -1)  # (n, size, size, channels)
    flip = rng.random(n) < 0.5
    crops[flip] = crops[flip, :, ::-1]
    return crops


def epochs_data(x, y, batch_size, seed):
    """A PyDataset of augmented, shuffled full batches, drawn anew each epoch (seeded by `seed`
    and the draw's count: the same sequence for every arm of a seed)."""
    import keras

    class Epochs(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.padded = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))
            self.epoch, self.images = 0, None

        def __len__(self):  # full batches only: one shape, one compiled step
            return len(x) // batch_size

        def __getitem__(self, i):
            if self.images is None:  # fit starts with on_epoch_end; a direct use may not
                self.on_epoch_end()
            rows = self.order[i * batch_size : (i + 1) * batch_size]
            return self.images[rows], y[rows]

        def on_epoch_end(self):
            rng = np.random.default_rng([seed, self.epoch])
            self.images, self.order = pad_crop_flip(self.padded, rng), rng.permutation(len(x))
            self.epoch += 1

    return Epochs()


def build(seed, args, shuffle, **options):
    """ShuffleNet v2 for 28x28 grey images; the seed fixes the initial weights."""
    import keras

    from keras_autoshuffle import applications

    keras.utils.set_random_seed(seed)
    return applications.AutoShuffleNetV2(
        width=args.width,
        input_shape=(28, 28, 1),
        classes=10,
        stem="cifar",
        shuffle=shuffle,
        penalty=args.penalty,
        sinkhorn_iterations=1,
        **options,
    )


def fit(model, data, epochs, args):
    """Trains `model` for `epochs` with the recipe; returns seconds per epoch and history."""
    import keras

    from keras_autoshuffle import relaxed_shuffles
    from keras_autoshuffle.optimizers import CoupledSGD, LinearCycles

    schedule = LinearCycles((args.learning_rate,), (epochs * len(data),))
    optimizer = CoupledSGD(schedule, momentum=0.9, l2=1e-4)
    optimizer.exclude_from_weight_decay(var_list=[s.matrix for s in relaxed_shuffles(model)])
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    ends = [time.perf_counter()]
    timer = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ends.append(time.perf_counter()))
    history = model.fit(data, epochs=epochs, verbose=0, callbacks=[timer]).history
    return np.diff(ends).tolist(), {k: [float(v) for v in vs] for k, vs in history.items()}


def accuracy(model, x, y):
    return float(model.evaluate(x, y, batch_size=500, verbose=0, return_dict=True)["accuracy"])


def run(arm, seed, args):
    """One run's row: final test accuracy (rounded nets for the learned arms) and its story."""
    import keras

    from keras_autoshuffle import RelaxedShuffle, harden_model, shuffle_layers, total_l12_penalty
    from keras_autoshuffle.hardening import routing_difference

    start = time.perf_counter()
    x, y, x_test, y_test = load_arrays(args.max_train_examples)
    row = {"arm": arm, "seed": seed, "backend": keras.backend.backend()}
    row.update({k: getattr(args, k) for k in SETTINGS})
    if arm == "search_retrain":
        search = build(seed, args, "auto")
        data = epochs_data(x, y, args.batch_size, seed)
        row["search_epoch_seconds"], _ = fit(search, data, args.search_epochs, args)
        row["search_epochs"] = args.search_epochs
        row["search_penalty"] = float(total_l12_penalty(search))
        harden_model(search)
        permutations = {
            layer.name: np.asarray(layer.permutation).tolist()
            for layer in shuffle_layers(search)
            if isinstance(layer, RelaxedShuffle)
        }
        model = build(seed, args, "auto", shuffle_permutations=permutations)
    else:
        model = build(seed, args, "manual" if arm == "manual" else "auto")
    # The manual run's data order from epoch 0 (the search drew epochs of its own).
    data = epochs_data(x, y, args.batch_size, seed)
    row["epoch_seconds"], row["history"] = fit(model, data, args.epochs, args)
    if arm == "paper":
        row["relaxed_accuracy"] = accuracy(model, x_test, y_test)
        row["penalty_at_rounding"] = float(total_l12_penalty(model))
        harden_model(model)
    row["accuracy"] = accuracy(model, x_test, y_test)
    row["routing_difference"] = float(routing_difference(model))
    row["seconds"] = time.perf_counter() - start
    return row


def append_row(path, row):
    """Appends one JSON line under an exclusive lock (the runs end concurrently)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def paired(rows, arm, baseline="manual"):
    """`arm` minus `baseline` accuracy over the seeds both finished: mean, 95% t interval."""
    from scipy import stats

    by = {(r["arm"], r["seed"]): r["accuracy"] for r in rows}
    seeds = sorted(s for a, s in by if a == arm and (baseline, s) in by)
    diffs = np.array([by[arm, s] - by[baseline, s] for s in seeds])
    if len(diffs) < 2:
        return {"arm": arm, "n": len(diffs), "mean": float(diffs.mean()) if len(diffs) else None}
    mean = float(diffs.mean())
    low, high = stats.t.interval(0.95, len(diffs) - 1, mean, stats.sem(diffs))
    return {"arm": arm, "n": len(diffs), "mean": mean, "low": float(low), "high": float(high)}


# A study's rows are a few kB each: more than this is not a rows file.
MAX_ROWS_BYTES = 64 * 2**20


def read_rows(path):
    """The rows of a `--rows` file; SystemExit naming the file and line for anything else."""
    if os.path.getsize(path) > MAX_ROWS_BYTES:
        raise SystemExit(f"error: {path} is over {MAX_ROWS_BYTES} bytes: not a rows file")
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not {"arm", "seed", "accuracy"} <= row.keys():
                raise SystemExit(f"error: {path} line {number} is not a row. Received: {line:.120}")
            rows.append(row)
    return rows


def summary(rows):
    """Markdown: each arm's accuracies by seed, then each learned arm minus manual."""
    lines = ["| arm | runs | mean accuracy | by seed |", "|---|---|---|---|"]
    for arm in ARMS:
        mine = sorted((r["seed"], r["accuracy"]) for r in rows if r["arm"] == arm)
        if mine:
            values = ", ".join(f"{s}: {a:.4f}" for s, a in mine)
            mean = np.mean([a for _, a in mine])
            lines.append(f"| {arm} | {len(mine)} | {mean:.4f} | {values} |")
    lines += ["", "| arm - manual | seeds | mean (points) | 95% t interval |", "|---|---|---|---|"]
    for arm in ARMS[1:]:
        p = paired(rows, arm)
        if p["n"] >= 2:
            interval = f"{100 * p['low']:+.2f} to {100 * p['high']:+.2f}"
            lines.append(f"| {arm} | {p['n']} | {100 * p['mean']:+.2f} | {interval} |")
    return "\n".join(lines)


# What a row records of the study's settings; rows of other settings are another study.
SETTINGS = ("epochs", "search_epochs", "width", "batch_size", "learning_rate", "penalty")
SETTINGS += ("max_train_examples",)


def runs_to_do(args):
    """The (seed, arm) runs without a row in `--rows`; rows of other settings refused."""
    rows = read_rows(args.rows) if os.path.exists(args.rows) else []
    for row in rows:
        differ = [f"{k}={row.get(k)!r}" for k in SETTINGS if row.get(k) != getattr(args, k)]
        if differ:
            raise SystemExit(
                f"error: {args.rows} holds rows of other settings ({', '.join(differ)}); "
                "use another --rows. Received: "
                + ", ".join(f"{k}={getattr(args, k)!r}" for k in SETTINGS)
            )
    done = {(row["seed"], row["arm"]) for row in rows}
    return [(seed, arm) for seed in args.seeds for arm in args.arms if (seed, arm) not in done]


def launch(args, epochs, search_epochs, rows, runs):
    """Starts the (seed, arm) `runs`, each its own process, all at once; waits for them all.
    Returns the first non-zero exit status (a killed run's too), else 0."""
    settings = {
        "--epochs": epochs,
        "--search-epochs": search_epochs,
        "--width": args.width,
        "--batch-size": args.batch_size,
        "--learning-rate": args.learning_rate,
        "--penalty": args.penalty,
        "--rows": rows,
    }
    if args.max_train_examples:
        settings["--max-train-examples"] = args.max_train_examples
    command = [sys.executable, "-m", "experiments.scale_study"]
    command += [str(x) for pair in settings.items() for x in pair]
    # JAX takes 75% of a GPU's memory per process by default: one process would hold it.
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **os.environ}
    procs = [
        subprocess.Popen([*command, "--worker", arm, "--seeds", str(seed)], env=env)
        for seed, arm in runs
    ]
    codes = [p.wait() for p in procs]
    return next((code for code in codes if code), 0)


def search_epochs_of(epochs):
    """The search's share of a run, as in the study (3 of 10 epochs)."""
    return max(1, round(0.3 * epochs))


def epochs_that_fit(calibration, seconds, most):
    """The most epochs, at most `most`, after which every run ends within `seconds`, from
    the 2-epoch runs (1 search epoch): each run's wall time, and each further epoch (search
    epochs included) at 1.2 times the slowest run's last epoch (the runs ended at different
    times, so some last epochs had the machine to themselves; relaxed epochs are slower).
    0 when not even 2 epochs fit."""
    epoch = 1.2 * max(row["epoch_seconds"][-1] for row in calibration)

    def wall(row, epochs):
        extra = epochs - 2
        if row["arm"] == "search_retrain":
            extra += search_epochs_of(epochs) - 1
        return row["seconds"] + extra * epoch

    fits = [e for e in range(2, most + 1) if all(wall(r, e) <= seconds for r in calibration)]
    return max(fits, default=0)


def calibrate(args, deadline):
    """The epochs that end before `deadline` (time.time()), from 2-epoch runs of every run."""
    path = args.rows + ".calibration"
    if os.path.exists(path):
        os.remove(path)  # timings of this machine, now
    code = launch(args, 2, 1, path, [(s, a) for s in args.seeds for a in args.arms])
    rows = read_rows(path) if os.path.exists(path) else []
    if code or len(rows) < len(args.seeds) * len(args.arms):
        raise SystemExit(f"error: the 2-epoch calibration runs failed (exit status {code})")
    for row in rows:
        if not all(np.isfinite(row["history"]["loss"])):
            raise SystemExit(
                f"error: the calibration run {row['arm']} seed {row['seed']} diverged at "
                f"--learning-rate {args.learning_rate} (losses {row['history']['loss']}); "
                "lower it. Received: learning_rate=" + str(args.learning_rate)
            )
    # 30 s for the summary and the processes' ends.
    epochs = epochs_that_fit(rows, deadline - time.time() - 30, args.epochs)
    if not epochs:
        raise SystemExit(
            f"error: not even 2 epochs fit in the time left of --time-budget. "
            f"Received: time_budget={args.time_budget}"
        )
    print(f"calibrated: {epochs} epochs fit", flush=True)
    return epochs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--search-epochs", type=int, default=None, help="default: 30%% of epochs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--learning-rate", type=float, default=0.2)
    parser.add_argument("--penalty", type=float, default=1e-2, help="lambda of the learned arms")
    parser.add_argument("--max-train-examples", type=int, default=None)
    parser.add_argument("--rows", required=True, help="JSON-lines file the rows are appended to")
    parser.add_argument("--summary", action="store_true", help="only print the rows' summary")
    parser.add_argument(
        "--time-budget", type=float, default=None, help="seconds the whole study may take"
    )
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    start = time.time()
    if args.summary:
        print(summary(read_rows(args.rows)))
        return 0
    check_settings(args, parser)
    if args.time_budget is not None:
        args.epochs = calibrate(args, start + args.time_budget)
    if args.search_epochs is None:
        args.search_epochs = search_epochs_of(args.epochs)
    if args.worker:
        append_row(args.rows, run(args.worker, args.seeds[0], args))
        return 0
    runs = runs_to_do(args)
    code = launch(args, args.epochs, args.search_epochs, args.rows, runs) if runs else 0
    if os.path.exists(args.rows):
        print(summary(read_rows(args.rows)))
    return code


def check_settings(args, parser):
    """argparse errors for settings that cannot make a study, before anything runs."""

    def refuse(message, name):
        parser.error(f"{message}. Received: {name}={getattr(args, name)!r}")

    if args.epochs < 2:  # a search epoch and at least one more
        refuse("--epochs must be at least 2", "epochs")
    search = search_epochs_of(args.epochs) if args.search_epochs is None else args.search_epochs
    if not 1 <= search < args.epochs:
        refuse("--search-epochs must be in [1, epochs - 1]", "search_epochs")
    if args.batch_size < 1:
        refuse("--batch-size must be at least 1", "batch_size")
    if args.max_train_examples is not None and args.max_train_examples < args.batch_size:
        refuse(
            "--max-train-examples must be at least one batch (--batch-size)", "max_train_examples"
        )
    if args.time_budget is None:
        return
    if not 0 < args.time_budget < float("inf"):
        refuse("--time-budget must be positive seconds", "time_budget")
    if args.search_epochs is not None:
        refuse(
            "--time-budget chooses the search epochs (30% of the epochs); leave it out",
            "search_epochs",
        )
    if os.path.exists(args.rows) and os.path.getsize(args.rows):
        refuse(
            "--time-budget starts a study: --rows must be a new file (resume one with the "
            "--epochs its rows record)",
            "rows",
        )


if __name__ == "__main__":
    sys.exit(main())
