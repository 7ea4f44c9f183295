"""A RelaxedShuffle learns a hidden channel permutation, is hardened, and prints it.

Run: python examples/learn_permutation.py
"""

import keras
import numpy as np

import keras_autoshuffle as ka

CHANNELS = 16
keras.utils.set_random_seed(0)
true_perm = np.random.default_rng(0).permutation(CHANNELS)
x = np.random.default_rng(1).normal(size=(4096, 4, 4, CHANNELS)).astype("float32")
y = x[..., true_perm]  # the target: the input with its channels permuted

model = keras.Sequential([keras.Input((4, 4, CHANNELS)), ka.RelaxedShuffle(penalty=1e-2)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
hardening = ka.HardenShuffles(verbose=0)
history = model.fit(
    x,
    y,
    epochs=10,
    batch_size=256,
    verbose=0,
    callbacks=[ka.ShufflePenaltyLogger(), hardening],
)
print("penalty per epoch:", np.round(history.history["l12_penalty"], 3).tolist())
print(ka.format_hardening_report(hardening.report))
learned = model.layers[0].permutation
print("hidden permutation:   ", true_perm.tolist())
print("recovered permutation:", learned.tolist())
print("recovered exactly:", bool(np.array_equal(learned, true_perm)))
print("max abs error of the hardened model:", float(np.abs(model.predict(x, verbose=0) - y).max()))
