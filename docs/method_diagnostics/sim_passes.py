"""Penalty-only Algorithm 1 in NumPy: one constraint pass per step vs several.

N x N matrix from |N(0, 1)|, SGD with momentum 0.9, lr 0.1 linearly decayed over the
Fashion-MNIST study's 1570 steps (10 epochs of 157), the l1-2 penalty's gradient (+ optional
random "loss" noise on the nonzeros), then the package's constraint: the dead-line guard
(a row or column the clip would empty is refilled), then K x (clip, columns, rows).
Prints P at the end and the rows whose rounded entry is below 0.5 (an arbitrary channel).

    python sim_passes.py
"""
import numpy as np
from scipy.optimize import linear_sum_assignment
from sim_penalty import P, grad


def constrain(w, passes):
    n = w.shape[0]
    share = max(w.max(), 0) / n if w.max() > 0 else 1 / n
    for axis in (1, 0):  # as constraints._revive_dead_lines: rows, then columns
        dead = np.maximum(w, 0).sum(axis, keepdims=True) <= 0
        w = np.where(dead, w - w.max(axis, keepdims=True) + share, w)
    for _ in range(passes):
        w = np.maximum(w, 0)
        s = w.sum(0, keepdims=True); w = w / np.where(s > 0, s, 1)
        s = w.sum(1, keepdims=True); w = w / np.where(s > 0, s, 1)
    return w


def run(n, lam, passes, noise, steps=1570, seed=1):
    rng = np.random.default_rng(seed)
    m = constrain(np.abs(rng.standard_normal((n, n))), passes); v = np.zeros_like(m)
    for t in range(steps):
        g = lam * grad(m) + noise * rng.standard_normal(m.shape) * (m > 0)
        v = 0.9 * v - 0.1 * (1 - t / steps) * g
        m = constrain(m + v, passes)
    r, c = linear_sum_assignment(m, maximize=True)
    return P(m), int((m[r, c] < 0.5).sum())


print("| N | lambda | noise | " + " | ".join(f"P, weak rows ({k} passes)" for k in (1, 10)) + " |")
print("|---|---|---|---|---|")
for n in (48, 192):
    for lam in (3e-3, 1e-2, 1e-1):
        for noise in (0.0, 3e-3, 3e-2):
            cells = [run(n, lam, k, noise) for k in (1, 10)]
            print(f"| {n} | {lam:g} | {noise:g} | " + " | ".join(f"{p:.3f}, {u}" for p, u in cells) + " |", flush=True)
