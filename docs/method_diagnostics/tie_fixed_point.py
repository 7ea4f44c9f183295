"""The 3 x 5 tie unit (P = 1.7614) is a fixed point of Algorithm 1's penalty step, for any step size
that does not empty a row: M -> rownorm(colnorm(max(M - eta*lam*grad P(M), 0))) returns M."""
import numpy as np
from sim_penalty import constrain, grad, P
B = np.array([[0, .5, 0, 0, .5], [0, 0, 1/3, 2/3, 0], [2/3, 0, 1/3, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 1]])
print("P(B) =", P(B), " column sums:", B.sum(0).round(4), " row sums:", B.sum(1))
for step in (1e-4, 1e-2, 0.1, 0.3):
    out = constrain(B - step * grad(B))
    print(f"step {step:g}: max |change| = {np.abs(out - B).max():.2e}")
print("support has a perfect matching?", end=" ")
from scipy.optimize import linear_sum_assignment
r, c = linear_sum_assignment((B > 0).astype(float), maximize=True); print((B > 0)[r, c].sum() == 5)
# with a perturbation of the loss gradient kind (random, small): does it return to B?
rng = np.random.default_rng(0); M = B.copy()
for t in range(200):
    M = constrain(M - 0.01 * grad(M) - 1e-3 * rng.standard_normal(M.shape) * (M > 0))
print("after 200 steps with small random gradient on the nonzeros: max |M - B| =", np.abs(M - B).max().round(4))
