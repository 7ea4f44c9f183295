"""Small-scale reproduction of the paper's claims: Tables 3 and 5 and its pictures.

`reproduce()` trains, with fixed seeds, manual vs learned shuffles for ShuffleNet v1
(g=3) and v2, a lambda sweep (the paper's Table 5 values plus larger ones, since a short
schedule needs a stronger penalty), and plain rounding at the end vs hardening at an
earlier epoch followed by fine-tuning; then writes `results.json`, the paper's
pictures as PNG files and `report.md` with the tables beside the paper's numbers.

Reference:
    Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Section 4)
"""

import dataclasses
import json
import os
import time

from experiments import plots
from experiments.runs import RunSpec, check_settings, run_all
from keras_autoshuffle import _validation

# The paper's Table 5 (CIFAR-10, ShuffleNet v1 g=3, 200 epochs).
PAPER_TABLE5 = {
    0.0: (90.00, 10.00, 3.37e3),
    1e-5: (90.18, 38.18, 1.59e3),
    1e-4: (90.48, 11.37, 4.95e2),
    5e-4: (91.45, 71.50, 3.13e-1),
    1e-3: (91.76, 91.76, 5.07e-2),
}
# The paper's Tables 1 and 3 on CIFAR-10: (manual acc %, auto acc %, relative change).
PAPER_TABLE1_3 = {
    "v1_g3": (90.55, 91.76, 0.0),
    "v2_1.0": (91.90, 92.81, -2.15e-4),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What `reproduce()` runs. `quick()` fits in about 15 minutes on 2 CPU cores."""

    dataset: str = "digits"
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 0.1
    # v1 at 0.25x: a 10-epoch run takes about as long as v2 at 0.5x on 2 CPU cores.
    v1_width: float = 0.25
    v2_width: float = 0.5
    penalty: float = 5e-2
    sweep_model: str = "v2"
    lambdas: tuple = (0.0, 1e-5, 1e-4, 5e-4, 1e-3, 5e-2, 2e-1)
    harden_at_epoch: int = 5
    max_train_examples: int | None = None
    seed: int = 0
    # Keras's 'same', the graph docs/example_report was made with (see study.py).
    padding: str = "same"

    def __post_init__(self):
        check_settings(self)


def quick(dataset="digits"):
    return Settings(dataset=dataset)


def full(dataset="cifar10"):
    """The paper's CIFAR-10 scale: 200 epochs, widths 1.0, v1 g3 sweep (GPU hours)."""
    return Settings(
        dataset=dataset,
        epochs=200,
        batch_size=128,
        learning_rate=0.2,
        v1_width=1.0,
        v2_width=1.0,
        penalty=1e-3,
        sweep_model="v1",
        harden_at_epoch=150,
    )


def reproduce(settings, output_dir, log=print, jobs=1):
    """Runs every experiment and writes report.md, results.json and the PNGs.

    Args:
        settings: a `Settings` (`quick()` or `full()`).
        output_dir: receives report.md, results.json, the PNGs and `runs/`.
        log: called with one line per finished run.
        jobs: trainings run at once, each in its own process with `cpu_count // jobs`
            TensorFlow threads (small nets use 2 cores better as 2 one-thread processes).
    """
    _validation.positive_int(jobs, "jobs")
    os.makedirs(output_dir, exist_ok=True)
    start = time.time()
    runs_dir = os.path.join(output_dir, "runs")
    model, lam = settings.sweep_model, settings.penalty
    seed = settings.seed
    specs = [
        RunSpec(f"sweep_{model}_lambda_{x:g}", model, "auto", x, seed) for x in settings.lambdas
    ]
    for other in ("v1", "v2"):
        specs.append(RunSpec(f"{other}_manual", other, "manual", 0.0, seed))
        if other != model:
            specs.append(RunSpec(f"{other}_auto", other, "auto", lam, seed))
    at = settings.harden_at_epoch
    specs.append(RunSpec(f"{model}_auto_harden_at_{at}", model, "auto", lam, seed, at))

    rows = run_all(settings, specs, runs_dir, log=log, jobs=jobs)
    sweep = [rows[spec.name] for spec in specs[: len(settings.lambdas)]]
    comparison = []
    for other in ("v1", "v2"):
        comparison.append(rows[f"{other}_manual"])
        comparison.append(
            rows[f"sweep_{model}_lambda_{lam:g}"] if other == model else rows[f"{other}_auto"]
        )
    early = rows[specs[-1].name]
    figures = _figures(settings, sweep, comparison, output_dir)
    results = {
        "settings": dataclasses.asdict(settings),
        "lambda_sweep": [_public(r) for r in sweep],
        "comparison": [_public(r) for r in comparison],
        "early_hardening": _public(early),
        "figures": figures,
        "time": time.time() - start,
    }
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(render_report(results))
    return results


def _public(row):
    return {k: v for k, v in row.items() if not k.startswith("_")}


def _figures(settings, sweep, comparison, output_dir):
    figures = {}
    v1_auto = next(r for r in comparison if r["model"] == "v1" and r["shuffle"] == "auto")
    v1_manual = next(r for r in comparison if r["model"] == "v1" and r["shuffle"] == "manual")
    figures["pmat"] = plots.plot_matrices(
        {
            "learned (hardened)": v1_auto["_first_permutation"],
            "manual (g=3)": v1_manual["_first_permutation"],
        },
        os.path.join(output_dir, "pmat.png"),
        "ShuffleNet v1 (g=3): first shuffle unit",
    )
    smallest = min((r for r in sweep if r["lambda"] > 0), key=lambda r: r["lambda"])
    figures["smat"] = plots.plot_matrices(
        {
            "lambda = 0": sweep[0]["_first_matrix"],
            f"lambda = {smallest['lambda']:g}": smallest["_first_matrix"],
            f"lambda = {settings.penalty:g}": next(
                r["_first_matrix"] for r in sweep if r["lambda"] == settings.penalty
            ),
        },
        os.path.join(output_dir, "smat.png"),
        f"Relaxed first shuffle of {settings.sweep_model} before rounding",
    )
    reference = next(r for r in sweep if r["lambda"] == settings.penalty)
    figures["penaltyplot"] = plots.plot_penalty(
        reference["history"],
        os.path.join(output_dir, "penaltyplot.png"),
        f"{settings.sweep_model}, lambda = {settings.penalty:g}",
    )
    figures["roundplot"] = plots.plot_rounding(
        reference["history"],
        os.path.join(output_dir, "roundplot.png"),
        f"{settings.sweep_model}, lambda = {settings.penalty:g}",
    )
    return {k: os.path.basename(v) for k, v in figures.items()}


def _pct(value):
    return "-" if value is None else f"{100 * value:.2f}"


def render_report(results):
    """The markdown report: tables beside the paper's numbers, settings, pictures."""
    s = results["settings"]
    lines = [
        "# AutoShuffleNet reproduction at small scale",
        "",
        f"Data set `{s['dataset']}`, {s['epochs']} epochs, batch {s['batch_size']}, "
        f"lr {s['learning_rate']} (linear decay), seed {s['seed']}; v1 g=3 width "
        f"{s['v1_width']}, v2 width {s['v2_width']}. Total time {results['time'] / 60:.1f} min.",
        "Accuracies are on the test split, in %. The paper's numbers are CIFAR-10, 200 epochs.",
        "",
        "## Manual vs learned shuffle (paper Tables 1 and 3)",
        "",
        "| model | shuffle | lambda | relaxed acc | rounded acc | relative change "
        "| penalty | time (s) | paper acc | paper rel. change |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["comparison"]:
        key = "v1_g3" if row["model"] == "v1" else "v2_1.0"
        paper = PAPER_TABLE1_3[key]
        auto = row["shuffle"] == "auto"
        lines.append(
            f"| {row['model']}{' g3' if row['model'] == 'v1' else ''} | {row['shuffle']} "
            f"| {row['lambda']:g} | {_pct(row['relaxed_accuracy'])} "
            f"| {_pct(row['rounded_accuracy'])} "
            f"| {row['relative_change']:+.2e} | {row['penalty']:.3g} | {row['time']:.0f} "
            f"| {paper[1] if auto else paper[0]:.2f} | {f'{paper[2]:+.2e}' if auto else '-'} |"
        )
    lines += [
        "",
        f"## Effect of lambda (paper Table 5; here {s['sweep_model']})",
        "",
        "| lambda | relaxed acc | rounded acc | penalty | paper relaxed | paper rounded "
        "| paper penalty |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["lambda_sweep"]:
        paper = PAPER_TABLE5.get(row["lambda"])
        ref = (
            "| - | - | - |"
            if paper is None
            else f"| {paper[0]:.2f} | {paper[1]:.2f} | {paper[2]:.3g} |"
        )
        lines.append(
            f"| {row['lambda']:g} | {_pct(row['relaxed_accuracy'])} "
            f"| {_pct(row['rounded_accuracy'])} | {row['penalty']:.3g} {ref}"
        )
    early = results["early_hardening"]
    plain = next(r for r in results["lambda_sweep"] if r["lambda"] == s["penalty"])
    lines += [
        "",
        "## Plain rounding at the end vs hardening early, then fine-tuning",
        "",
        "| method | accuracy before hardening | final accuracy (exact permutations) |",
        "|---|---|---|",
        f"| round after epoch {s['epochs']} (the paper) | {_pct(plain['relaxed_accuracy'])} "
        f"| {_pct(plain['rounded_accuracy'])} |",
        f"| harden after epoch {s['harden_at_epoch']}, fine-tune to epoch {s['epochs']} "
        f"| {_pct(early['relaxed_accuracy'])} | {_pct(early['final_accuracy'])} |",
        "",
        "## Pictures",
        "",
    ]
    captions = {
        "pmat": "Fig. pmat: learned (hardened) vs manual permutation of the first v1 shuffle",
        "smat": "Fig. smat: relaxed matrices before rounding at several lambdas",
        "penaltyplot": "Fig. penaltyplot: training loss and penalty per epoch",
        "roundplot": "Fig. roundplot: relaxed vs rounded test accuracy per epoch",
    }
    for key, name in results["figures"].items():
        lines += [f"{captions[key]}", "", f"![{key}]({name})", ""]
    return "\n".join(lines)
