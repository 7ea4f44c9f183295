"""Rational fixed points in saved final matrices: python3 analyze_ties.py results/base_0.05.npz
Per layer: fractional entries and their values, column sums != 1, size of the largest matching
inside the support (m > 0): < N means no doubly stochastic matrix has this support, so the
column/row scaling cannot converge; spread of the penalty gradient over each tied row's nonzeros
(0 = the penalty cannot break the tie); whether argmax rounding agrees with exact rounding."""
import sys
import numpy as np
from scipy.optimize import linear_sum_assignment
from sim_penalty import grad, P

for path in sys.argv[1:]:
    z = np.load(path); print(path)
    print(f"{'layer':22s} N  P      frac values            colsum!=1             matching  grad-spread argmax=exact")
    for k in z.files:
        m = z[k].astype(np.float64); n = len(m)
        frac = (m > 1e-6) & (m < 1 - 1e-6)
        cs = m.sum(0); bad = np.round(np.unique(np.round(cs[np.abs(cs - 1) > 1e-4], 4)), 4)
        r, c = linear_sum_assignment((m > 0).astype(float), maximize=True)
        match = int((m > 0)[r, c].sum())
        g = grad(m); rows = np.where(frac.any(1))[0]
        spread = max([np.ptp(g[i][m[i] > 1e-2]) for i in rows if (m[i] > 1e-2).sum() > 1] or [0.0])
        argmax_ok = np.array_equal(m.argmax(1), c if match == n else linear_sum_assignment(m, maximize=True)[1])
        vals = sorted({round(float(v), 4) for v in m[frac]})
        print(f"{k:22s}{n:3d} {P(m):6.3f} {int(frac.sum()):3d} {str(vals[:4]):18s} {str(bad.tolist()[:4]):22s}"
              f"{match:4d}/{n:<4d} {spread:.1e}     {argmax_ok}")
