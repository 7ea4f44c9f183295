"""One digits-preset training (v2 0.5x, 10 epochs) with matrix diagnostics, base or a fix.

Usage: python run.py --lam 0.2 --variant base|guard|nomom|guard_nomom [--tag X]
Writes results/<variant>_<lam>.json and .npz (final matrices). One thread.

Variants (all monkeypatched here; the package untouched):
  base        the package as is (Algorithm 1 + recipe "digits").
  guard       DoublyStochastic with the dead row/column guard (fixes.guarded_call).
  nomom       the shuffle matrices take a plain SGD step (Algorithm 1 step 3, no momentum).
  guard_nomom both.
"""

import argparse
import json
import os
import time

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import fixes  # noqa: E402
from keras_autoshuffle import applications, constraints, data, permutations  # noqa: E402
from keras_autoshuffle.callbacks import harden_model  # noqa: E402
from keras_autoshuffle.data import EpochCounter  # noqa: E402
from keras_autoshuffle.layers import relaxed_shuffles  # noqa: E402
from keras_autoshuffle.optimizers import CoupledSGD, LinearCycles  # noqa: E402
from keras_autoshuffle.regularizers import l12_penalty  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--lam", type=float, required=True)
p.add_argument("--variant", default="base")
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--harden-at", type=int, default=None, help="harden after this epoch, fine-tune the rest")
p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
name = f"{args.variant}_{args.lam:g}" + (f"_h{args.harden_at}" if args.harden_at else "")

if "guard" in args.variant:
    constraints.DoublyStochastic.__call__ = fixes.guarded_call
if "ramp" in args.variant:  # lambda_t = lambda * t / T (penalty strength ramped 0 -> lambda)
    from keras_autoshuffle import regularizers

    ramp = keras.Variable(0.0, trainable=False, name="lambda_ramp")
    _plain_penalty = regularizers.L12Penalty.__call__
    regularizers.L12Penalty.__call__ = lambda self, x: ramp * _plain_penalty(self, x)


class MatrixPlainSGD(CoupledSGD):
    """CoupledSGD, but the shuffle matrices take Algorithm 1's plain step M -= lr * grad."""

    def update_step(self, gradient, variable, learning_rate):
        if variable.path.endswith("/matrix"):
            lr = ops.cast(learning_rate, variable.dtype)
            self.assign_sub(variable, ops.multiply(ops.cast(gradient, variable.dtype), lr))
            return
        super().update_step(gradient, variable, learning_rate)


def stats(m):
    """Diagnostics of one matrix (numpy)."""
    rs, cs = m.sum(1), m.sum(0)
    frac = (m > 1e-6) & (m < 1 - 1e-6)
    return {
        "n": int(m.shape[0]),
        "dead_rows": int((rs == 0).sum()),
        "dead_cols": int((cs == 0).sum()),
        "fractional": int(frac.sum()),
        "frac_values": sorted({round(float(v), 4) for v in m[frac]})[:8],
        "col_sum_max": float(cs.max()),
        "penalty": float(ops.convert_to_numpy(l12_penalty(m))),
        "argmax_agrees": permutations.argmax_agrees(m),
    }


class Track(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if "ramp" in args.variant:
            ramp.assign(min(1.0, len(self.steps) / (args.epochs * steps)))

    def __init__(self):
        self.steps = []  # per step: total dead rows, dead cols, dead matrices, penalty sum

    def on_train_batch_end(self, batch, logs=None):
        dr = dc = dm = 0
        for layer in relaxed_shuffles(self.model):
            m = ops.convert_to_numpy(layer.matrix)
            rs, cs = m.sum(1), m.sum(0)
            dr += int((rs == 0).sum())
            dc += int((cs == 0).sum())
            dm += int(m.sum() == 0)
        self.steps.append((dr, dc, dm))


t0 = time.time()
keras.utils.set_random_seed(args.seed)
train, test = data.digits(seed=args.seed)
model = applications.ShuffleNetV2(
    width=0.5, shuffle="auto", penalty=args.lam, input_shape=(32, 32, 3), classes=10, stem="cifar"
)
batch = 64
steps = train.steps(batch)
schedule = LinearCycles([0.1], [args.epochs * steps])
opt_cls = MatrixPlainSGD if "nomom" in args.variant else CoupledSGD
optimizer = opt_cls(schedule, momentum=0.9, l2=1e-4)
optimizer.exclude_from_weight_decay(var_list=[s.matrix for s in relaxed_shuffles(model)])
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
counter = EpochCounter()
track = Track()
evald = test.eval_dataset(batch)
extra, snap = [], {}
if args.harden_at:
    from keras_autoshuffle.callbacks import HardenShuffles

    class Snap(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == args.harden_at:
                snap.update({l.name: ops.convert_to_numpy(l.matrix) for l in relaxed_shuffles(self.model)})

    hs = HardenShuffles(validation_data=evald, at_epoch=args.harden_at, verbose=0)
    extra = [Snap(), hs]
hist = model.fit(
    train.fit_dataset(batch, counter),
    epochs=args.epochs,
    callbacks=[counter.callback(), track, *extra],
    shuffle=False,
    verbose=0,
)
relaxed = model.evaluate(evald, verbose=0, return_dict=True)["accuracy"]
if args.harden_at:  # relaxed/rounded at the hardening epoch; "rounded" = after fine-tuning
    relaxed, rounded_at = hs.report["relaxed_accuracy"], hs.report["rounded_accuracy"]
probs = model.predict(evald, verbose=0)
pred_std = float(probs.std(axis=0).mean())  # ~0: the output is the same for every input
mats = snap or {layer.name: ops.convert_to_numpy(layer.matrix) for layer in relaxed_shuffles(model)}
layers = {k: stats(v) for k, v in mats.items()}
harden_model(model) if relaxed_shuffles(model) else None
rounded = model.evaluate(evald, verbose=0, return_dict=True)["accuracy"]
np.savez_compressed(os.path.join(args.out, name + ".npz"), **mats)
steps_arr = np.array(track.steps)
result = {
    "variant": args.variant,
    "lam": args.lam,
    "relaxed_acc": relaxed,
    "rounded_acc": rounded,
    "train_acc_last": hist.history["accuracy"][-1],
    "penalty_sum": sum(s["penalty"] for s in layers.values()),
    "dead_rows": sum(s["dead_rows"] for s in layers.values()),
    "dead_cols": sum(s["dead_cols"] for s in layers.values()),
    "dead_matrices": sum(int(s["dead_rows"] == s["n"]) for s in layers.values()),
    "fractional": sum(s["fractional"] for s in layers.values()),
    "argmax_disagree_layers": sum(int(not s["argmax_agrees"]) for s in layers.values()),
    "pred_std": pred_std,
    "rounded_acc_at_harden": rounded_at if args.harden_at else None,
    "dead_rows_by_step": steps_arr[:, 0].tolist(),
    "dead_cols_by_step": steps_arr[:, 1].tolist(),
    "dead_mats_by_step": steps_arr[:, 2].tolist(),
    "layers": layers,
    "seconds": time.time() - t0,
}
with open(os.path.join(args.out, name + ".json"), "w") as f:
    json.dump(result, f, indent=1)
keys = ("relaxed_acc", "rounded_acc", "penalty_sum", "dead_rows", "dead_cols", "dead_matrices",
        "fractional", "argmax_disagree_layers", "pred_std", "seconds")
print(name, {k: round(result[k], 4) for k in keys})
