"""Where the int8 files disagree with the float net (issue 53, item 2): on the transfer
study's fine-tuned nets no lever brought top-1 agreement to 99%. This measures each
runtime's default int8 file (`int8_equalize.measure_files`: finetune's calibration and
validation images; LiteRT as finetune writes it) against the float Keras model and counts
agreement by the float net's top-1 margin (its top probability minus the second), in bins
fixed before measuring (`EDGES`). An int8 file that only flips near-ties disagrees in the
low bins; one that is wrong where the float net is sure disagrees in the high ones. Not in
CI.

One row per (net, runtime) appended to `--rows` as measured; a rerun skips the nets it
holds.

Usage:
    python -m experiments.int8_margins measure --results runs/transfer_regen \
        --work runs/transfer_regen_work --rows docs/results/transfer_int8/margins.jsonl
    python -m experiments.int8_margins table --rows docs/results/transfer_int8/margins.jsonl
"""

import argparse
import json

import numpy as np

from experiments import int8_equalize, int8_transfer_levers
from experiments.int8_accuracy import _row
from experiments.scale_study import append_row
from experiments.transfer_study import t_interval

# The float net's top-1 margin bins (probability points), chosen before any measurement.
EDGES = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)


def top1_margins(probabilities: np.ndarray) -> np.ndarray:
    """Each row's largest probability minus its second largest."""
    top2 = np.sort(np.asarray(probabilities, "float64"), axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def bin_counts(margins: np.ndarray, agree: np.ndarray) -> list[list[int]]:
    """[images, agreeing images] per margin bin of `EDGES` (the last bin holds 1.0)."""
    which = np.clip(np.searchsorted(EDGES, margins, side="right") - 1, 0, len(EDGES) - 2)
    return [
        [int(np.sum(which == b)), int(np.sum(agree[which == b]))] for b in range(len(EDGES) - 1)
    ]


def measure_net(name, model, folded, calibration, test, lite_inputs, write):
    """Each runtime's default int8 file of one net; each row given to `write`."""
    float_outputs = model.predict(test[0], batch_size=256, verbose=0)
    if not np.allclose(float_outputs.sum(-1), 1.0, atol=1e-3):
        raise ValueError(f"{name}: the model's outputs are not probabilities (softmax).")
    margins = top1_margins(float_outputs)
    entries = int8_equalize.measure_files(
        folded, lite_inputs(folded), calibration, test, float_outputs
    )
    for runtime, entry in entries.items():
        agree = entry["outputs"].argmax(-1) == float_outputs.argmax(-1)
        write(
            {
                **_row(name, runtime, entry),
                "net": name,
                "edges": list(EDGES),
                "bins": bin_counts(margins, agree),
                "test_images": len(test[1]),
                "calibration_images": len(calibration),
            }
        )


def summarize(rows: list[dict]) -> list[dict]:
    """Per runtime and margin bin: images and disagreements pooled over the nets, the
    pooled agreement (%), the share of all the runtime's disagreements in the bin (%), and
    the mean over nets of each net's agreement in the bin (%, 95% t; nets with images in
    the bin)."""
    summary = []
    for runtime in dict.fromkeys(r["runtime"] for r in rows):
        picked = [r for r in rows if r["runtime"] == runtime]
        counts = np.array([r["bins"] for r in picked])  # nets x bins x (images, agreeing)
        misses = counts[:, :, 0] - counts[:, :, 1]
        for b in range(counts.shape[1]):
            images, agreeing = counts[:, b].sum(0)
            per_net = [100 * a / n for n, a in counts[:, b] if n]
            summary.append(
                {
                    "runtime": runtime,
                    "bin": picked[0]["edges"][b : b + 2],
                    "nets": len(picked),
                    "images": int(images),
                    "disagreements": int(images - agreeing),
                    "agreement": 100 * agreeing / images if images else None,
                    "share_of_disagreements": 100 * misses[:, b].sum() / max(misses.sum(), 1),
                    "per_net": t_interval(per_net) if per_net else None,
                }
            )
    return summary


def table(summary: list[dict]) -> str:
    """The summary as a Markdown table."""
    lines = [
        "| runtime | float top-1 margin | images | disagreements | agreement (%) "
        "| share of the disagreements (%) | agreement per net (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        low, high = e["bin"]
        agreement = "-" if e["agreement"] is None else f"{e['agreement']:.2f}"
        per_net = "-"
        if e["per_net"] and e["per_net"]["low"] is not None:
            p = e["per_net"]
            per_net = f"{p['mean']:.2f} [{p['low']:.2f}, {p['high']:.2f}] ({p['n']} nets)"
        lines.append(
            f"| {e['runtime']} | [{low:g}, {high:g}{']' if high == 1 else ')'} | {e['images']} "
            f"| {e['disagreements']} | {agreement} | {e['share_of_disagreements']:.1f} "
            f"| {per_net} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("measure", "table"))
    parser.add_argument("--rows", required=True, help="JSON lines, appended as measured")
    parser.add_argument("--results", help="measure: the transfer study's results folder")
    parser.add_argument("--work", help="measure: its --work folder")
    args = parser.parse_args(argv)
    if args.action == "measure":
        if not (args.results and args.work):
            parser.error("measure needs --results and --work")
        done = {r["net"] for r in int8_transfer_levers.read_levers(args.rows)}
        for net in int8_equalize.transfer_nets(args.results, args.work):
            name, _, model, folded, calibration, test, lite_inputs, extra = net
            if name in done:
                continue

            def write(row, extra=extra):
                append_row(args.rows, {**row, **extra})
                print(json.dumps(row), flush=True)

            measure_net(name, model, folded, calibration, test, lite_inputs, write)
    print(table(summarize(int8_transfer_levers.read_levers(args.rows))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
