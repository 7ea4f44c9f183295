"""The rational fixed point of the penalty-only run (N=48, lam=5e-2): print its block."""
import numpy as np
from sim_penalty import constrain, grad, P
rng = np.random.default_rng(0); n, lam, steps = 48, 5e-2, 220
m = constrain(np.abs(rng.standard_normal((n, n)))); v = np.zeros_like(m)
for t in range(steps):
    v = 0.9 * v - 0.1 * (1 - t / steps) * lam * grad(m); m = constrain(m + v)
    if t in (5, 10, 30, 219):
        frac = (m > 1e-6) & (m < 1 - 1e-6)
        rows = np.where(frac.any(1))[0]; cols = np.where(m[rows].sum(0) > 0)[0]
        print(f"step {t}: P={P(m):.4f}, fractional {frac.sum()}, column sums != 1: "
              f"{np.round(m.sum(0)[np.abs(m.sum(0) - 1) > 1e-6], 4)}")
        if t == 219:
            print("block rows", rows, "cols", cols); print(np.round(m[np.ix_(rows, cols)], 4))
            print("all entries in those columns from other rows:",
                  np.round(np.delete(m[:, cols], rows, axis=0).sum(0), 4))
            g = grad(m)[np.ix_(rows, cols)]; print("penalty gradient on the block:\n", np.round(g, 4))
            print("exactly equal pairs kept by one more step:", np.array_equal(constrain(m - 0.001 * grad(m)), m))
