"""Markdown table of results/*.json: python3 table.py"""
import glob, json
import numpy as np
from scipy.optimize import linear_sum_assignment


def support_stats(npz):
    """(entries in [0.01, 0.99], rows the support cannot match = N - max matching in m > 0)."""
    z = np.load(npz); mid = unmatched = 0
    for k in z.files:
        m = z[k]; mid += int(((m >= 0.01) & (m <= 0.99)).sum())
        r, c = linear_sum_assignment((m > 0).astype(float), maximize=True)
        unmatched += len(m) - int((m > 0)[r, c].sum())
    return mid, unmatched
rows = []
for f in sorted(glob.glob("results/*.json")):
    r = json.load(open(f)); d0 = r["dead_rows_by_step"][0] if r["dead_rows_by_step"] else 0
    name = f.split("/")[-1][:-5]
    rows.append((r["variant"] + ("+ft" if "_h" in name else ""), r["lam"], r["relaxed_acc"], r["rounded_acc"],
                 r.get("rounded_acc_at_harden"), r["penalty_sum"], r["dead_rows"], r["dead_cols"], d0,
                 max(r["dead_rows_by_step"] or [0]), r["dead_matrices"], r["fractional"],
                 r["argmax_disagree_layers"], r["pred_std"], r["seconds"], *support_stats(f[:-5] + ".npz")))
rows.sort(key=lambda x: (x[0], x[1]))
print("| variant | lambda | relaxed acc | rounded acc | rounded at harden (before ft) | final P sum | dead rows / cols (end) "
      "| dead rows after step 1 / max | dead matrices | fractional entries (0.01-0.99) | unmatched rows | layers argmax != exact | output std | s |")
print("|" + "---|" * 14)
for v, l, ra, ro, rh, p, dr, dc, d0, dmax, dm, fr, ad, sd, s, mid, um in rows:
    rh = "" if rh is None else f"{rh:.4f}"
    print(f"| {v} | {l:g} | {ra:.4f} | {ro:.4f} | {rh} | {p:.2f} | {dr} / {dc} | {d0} / {dmax} | {dm} | {fr} ({mid}) | {um} | {ad}/16 | {sd:.3f} | {s:.0f} |")
