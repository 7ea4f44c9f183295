"""Digits preset (v2 0.5x, 10 epochs, padding 'same'): one constraint pass per step vs K.

    python docs/method_diagnostics/passes_digits.py --passes 1 10 --lambdas 0.05 --seeds 0 1 2

One row per run in results/passes_digits/<name>.json (a rerun skips finished runs)."""

import argparse
import json
import os

from keras_autoshuffle import data
from keras_autoshuffle.experiments import runs
from keras_autoshuffle.experiments.reproduce import Settings

parser = argparse.ArgumentParser()
parser.add_argument("--passes", type=int, nargs="+", default=[1, 10])
parser.add_argument("--lambdas", type=float, nargs="+", default=[0.05])
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
parser.add_argument("--work", default="/tmp/passes_digits")
args = parser.parse_args()
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "passes_digits")
os.makedirs(here, exist_ok=True)
for seed in args.seeds:
    splits = data.load("digits", seed=seed)
    for lam in args.lambdas:
        for k in args.passes:
            name = f"lambda{lam:g}_passes{k}_seed{seed}"
            if os.path.exists(os.path.join(here, name + ".json")):
                continue
            spec = runs.RunSpec(name, "v2", "auto", lam, seed, sinkhorn_iterations=k)
            row = runs.run_one(
                Settings(penalty=lam, lambdas=(0.0, lam)), splits, spec, os.path.join(args.work, name)
            )
            keep = ("relaxed_accuracy", "rounded_accuracy", "penalty", "seconds")
            result = {"lambda": lam, "passes": k, "seed": seed, **{x: row[x] for x in keep}}
            with open(os.path.join(here, name + ".json"), "w") as f:
                json.dump(result, f, indent=1)
            print(json.dumps(result), flush=True)
