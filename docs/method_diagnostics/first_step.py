"""Predicted deaths at the first step from the penalty alone: entries below lr*lam*grad are clipped.
(First step: Keras SGD velocity = -lr*g, so the step is exactly lr*lam*dP/dm; no momentum yet.)"""
import numpy as np
from sim_penalty import constrain, grad
lr = 0.1
print("lam  N  step(median)  row-max(median)  rows dead  cols dead  (of N)  matrix dead?")
for lam in (1e-3, 1e-2, 5e-2, 0.2, 1.0):
    for n in (48, 96, 192):
        m = constrain(np.abs(np.random.default_rng(0).standard_normal((n, n))))
        step = lr * lam * grad(m)
        w = np.maximum(m - step, 0)
        print(f"{lam:<5g}{n:4d}  {np.median(step):.4f}        {np.median(m.max(1)):.4f}          "
              f"{int((w.sum(1) == 0).sum()):4d}       {int((w.sum(0) == 0).sum()):4d}     {bool(w.sum() == 0)}")
