"""Penalty-only Algorithm 1 in NumPy (no loss): does lambda*lr*momentum kill rows/columns?

One matrix N x N, init |N(0,1)| + one constraint pass, 220 steps (digits preset: 22 steps x
10 epochs), lr 0.1 linear decay, momentum 0.9 (Keras SGD form), gradient of Eq. (1) with
sign(0) = 0 (as TF's abs), then clip / column / row (optionally the guard).
"""
import sys
import numpy as np

def constrain(w, guard=False):
    c = np.maximum(w, 0)
    if guard:
        for ax in (1, 0):
            dead = c.sum(ax, keepdims=True) <= 0
            refill = np.maximum(w - w.max(ax, keepdims=True) + 1 / w.shape[0], 0)
            c = np.where(dead, refill, c)
    s = c.sum(0, keepdims=True); c = c / np.where(s > 0, s, 1)
    s = c.sum(1, keepdims=True); return c / np.where(s > 0, s, 1)

def grad(m):
    r = np.sqrt((m * m).sum(1, keepdims=True)); c = np.sqrt((m * m).sum(0, keepdims=True))
    return 2 * np.sign(m) - m / np.where(r > 0, r, 1) - m / np.where(c > 0, c, 1)

def P(m):
    return (np.abs(m).sum() * 2 - np.sqrt((m * m).sum(1)).sum() - np.sqrt((m * m).sum(0)).sum())

def run(n, lam, mom=0.9, guard=False, steps=220, lr0=0.1, seed=0):
    rng = np.random.default_rng(seed)
    m = constrain(np.abs(rng.standard_normal((n, n))))
    v = np.zeros_like(m); first = None
    for t in range(steps):
        lr = lr0 * (1 - t / steps)
        v = mom * v - lr * lam * grad(m)
        m = constrain(m + v, guard)
        dead = int((m.sum(1) == 0).sum() + (m.sum(0) == 0).sum())
        if dead and first is None: first = t
    frac = int(((m > 1e-6) & (m < 1 - 1e-6)).sum())
    return dict(P=P(m), dead_rows=int((m.sum(1) == 0).sum()), dead_cols=int((m.sum(0) == 0).sum()),
                first_dead_step=first, frac=frac,
                values=sorted({round(float(x), 4) for x in m[(m > 1e-6) & (m < 1 - 1e-6)]})[:6])

if __name__ == "__main__":
    print("N lam mom guard | P_final dead_rows dead_cols first_dead_step fractional values")
    for n in (48, 192):
        for lam in (1e-3, 1e-2, 5e-2, 0.2, 1.0):
            for mom, guard in ((0.9, False), (0.0, False), (0.9, True)):
                r = run(n, lam, mom, guard)
                print(n, lam, mom, guard, "|", round(r["P"], 3), r["dead_rows"], r["dead_cols"],
                      r["first_dead_step"], r["frac"], r["values"])
