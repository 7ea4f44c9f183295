"""Guard == Algorithm 1 bit for bit when no row/column is all <= 0; what it does otherwise."""
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1); tf.config.threading.set_inter_op_parallelism_threads(1)
import numpy as np
from keras import ops
import fixes
from keras_autoshuffle.constraints import DoublyStochastic

rng = np.random.default_rng(0)
plain = DoublyStochastic(1)
same = 0
for trial in range(200):
    n = int(rng.choice([12, 48, 96, 192]))
    # a doubly stochastic-ish matrix after an SGD step: many entries negative, but no dead line
    w = (rng.random((n, n)) / n - rng.random() * 2 / n).astype("float32")
    w[np.arange(n), rng.permutation(n)] = 1.0  # every row and column keeps a positive entry
    a = ops.convert_to_numpy(plain(w)); b = ops.convert_to_numpy(fixes.guarded_call(plain, w))
    same += np.array_equal(a, b)
print(f"no dead line: bitwise identical in {same}/200 random cases")
w = np.array([[0.6, 0.3, -0.1], [-0.2, -0.05, -0.3], [0.2, 0.5, 0.4]], "float32")
print("row 1 all negative; plain:\n", ops.convert_to_numpy(plain(w)).round(3))
print("guarded:\n", ops.convert_to_numpy(fixes.guarded_call(plain, w)).round(3))
