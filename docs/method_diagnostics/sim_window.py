"""Penalty-only window: for which lambda does Algorithm 1 reach an exact permutation in 220 steps?
Cell = final P (sum over 3 seeds), '*' = some dead row/col at the end, '~' = rational tie left."""
import numpy as np
from sim_penalty import constrain, grad, P

def run(n, lam, mom, guard, seed, steps=220):
    rng = np.random.default_rng(seed)
    m = constrain(np.abs(rng.standard_normal((n, n)))); v = np.zeros_like(m)
    for t in range(steps):
        v = mom * v - 0.1 * (1 - t / steps) * lam * grad(m); m = constrain(m + v, guard)
    dead = (m.sum(1) == 0).sum() + (m.sum(0) == 0).sum()
    frac = ((m > 1e-6) & (m < 1 - 1e-6)).sum()
    return P(m), dead, frac

lams = [1e-3, 3e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0]
print("lam:", lams)
for n in (48, 96, 192):
    for mom, guard in ((0.9, False), (0.9, True), (0.0, False), (0.0, True)):
        cells = []
        for lam in lams:
            rs = [run(n, lam, mom, guard, s) for s in range(3)]
            p = sum(r[0] for r in rs); mark = "*" if any(r[1] for r in rs) else ("~" if p > 1e-3 and all(r[2] < 60 for r in rs) else "")
            cells.append(f"{p:7.2f}{mark:1s}")
        print(f"N={n:3d} mom={mom} guard={guard!s:5s}", " ".join(cells))
