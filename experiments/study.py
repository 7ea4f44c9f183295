"""The Fashion-MNIST study: the paper's claims on 10,000 real test images, over seeds.

Manual vs learned shuffles for ShuffleNet v1 (g=3) and v2 over several seeds (the paper's
Tables 1 and 3), a lambda sweep with lambda = 0 (Table 5), plain rounding at the end vs
hardening early and fine-tuning, one constraint pass per step (the paper's, which the
comparison and the sweep use) vs `sinkhorn_iterations`, and how far each learned routing
is from the manual one (`hardening.routing_difference`). Every run keeps its row on disk
(`runs/<name>/result.json`); a rerun reads finished rows back and resumes a killed
training from its backup, so the study can span sessions.
"""

import dataclasses
import os
import time

import numpy as np

from experiments import plots
from experiments.runs import RunSpec, check_settings, run_all
from keras_autoshuffle import data
from keras_autoshuffle._atomic import as_json, write_json
from keras_autoshuffle.constraints import check_iterations
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError, read_json


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """What the study runs (see docs/fashion_mnist/report.md for why these values)."""

    dataset: str = "fashion_mnist"
    max_train_examples: int | None = 20_000
    epochs: int = 10
    batch_size: int = 128
    learning_rate: float = 0.1
    v1_width: float = 0.25
    v2_width: float = 0.5
    penalty: float = 1e-2
    lambdas: tuple = (0.0, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    seeds: tuple = (0, 1, 2)
    harden_at_epoch: int = 8
    # The fix tried for the rounding loss: this many constraint passes per step (the
    # paper: 1) ends on exact permutations where one pass stalls (docs/lab-notes/training.md).
    sinkhorn_iterations: int = 10
    data_dir: str | None = None
    # Keras's 'same': the graph the study's first runs were trained with, before the
    # builders' default became PyTorch's padding. Trained from scratch, no weights to match.
    padding: str = "same"
    # The arms screened on v2 over `seeds` against the manual shuffle (see ARMS).
    arms: tuple = ("warm", "warm_hard", "search_retrain", "balanced_fixed")
    # The arms that go on to the verdict: v1 and v2 over `verdict_seeds`, with the manual
    # nets of those seeds and v1 with `sinkhorn_iterations` passes (chosen after screening).
    finalists: tuple = ()
    verdict_seeds: tuple = (0, 1, 2, 3, 4)
    # Seeds beyond `verdict_seeds` for v2 only (its manual net and the finalists): v2's
    # paired spread (sd 0.4-0.5 points) needs about 12 seeds for a +-0.3 interval;
    # v1's intervals already sit near its A/A noise floor (docs/fashion_mnist).
    more_seeds: tuple = ()
    # Epochs of the search in "search_retrain" (then the whole schedule from fresh weights).
    search_epochs: int = 3

    def __post_init__(self):
        check_settings(self)
        check_iterations(self.sinkhorn_iterations, "sinkhorn_iterations")
        if self.sinkhorn_iterations == 1:
            raise ValueError(
                "`sinkhorn_iterations` is what the study compares one pass per step with (the "
                "comparison's runs); it must be at least 2. Received: sinkhorn_iterations=1"
            )
        if not self.seeds:
            raise ValueError(f"`seeds` must not be empty. Received: seeds={self.seeds}")
        for name in ("seeds", "verdict_seeds", "more_seeds"):
            for seed in getattr(self, name):
                if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                    raise ValueError(
                        f"`{name}` must hold non-negative integers. "
                        f"Received: {name}={getattr(self, name)!r}"
                    )
        for name in ("arms", "finalists"):
            unknown = [arm for arm in getattr(self, name) if arm not in ARMS]
            if unknown:
                raise ValueError(
                    f"`{name}` must name arms among {sorted(ARMS)}. "
                    f"Received: {name}={getattr(self, name)!r}"
                )
        if not 1 <= self.search_epochs < self.epochs:
            raise ValueError(
                f"`search_epochs` must be in [1, epochs - 1]. "
                f"Received: search_epochs={self.search_epochs!r}"
            )


# The arms that end on exact permutations, beside the paper's (one pass, random start,
# rounded at the end), measured against the manual shuffle by seed (docs/lab-notes/training.md):
ARMS = {
    # the manual permutation as the starting matrix, trained relaxed
    "warm": {"shuffle_initializer": "manual"},
    # the manual start with a hard forward pass (nearest permutation, straight-through)
    "warm_hard": {"shuffle_initializer": "manual", "shuffle_forward": "hard"},
    # the paper's start searched for `search_epochs`, hardened, then a fresh net trained
    # with those permutations fixed (initialised as the manual net of the same seed)
    "search_retrain": {"search_epochs": None},
    # a v2 routing that folds as cheaply as the manual one (v1: the manual counts), the
    # balanced hardening of the fresh net's matrices, fixed from the first step
    "balanced_fixed": {"search_epochs": 0, "balanced": True},
    # ten constraint passes per step, random start, rounded at the end (runs named
    # `_sinkhorn<k>_`, the study's first fix)
    "ten_passes": {},
}


def specs(settings):
    """Every run of the study, the comparison first (so partial results are useful)."""
    lam, at = settings.penalty, settings.harden_at_epoch
    runs = []
    for seed in settings.seeds:
        for model in ("v2", "v1"):
            runs.append(RunSpec(f"{model}_manual_seed{seed}", model, "manual", 0.0, seed))
            runs.append(RunSpec(f"{model}_auto_lambda{lam:g}_seed{seed}", model, "auto", lam, seed))
    runs += [
        RunSpec(f"v2_auto_lambda{x:g}_seed{settings.seeds[0]}", "v2", "auto", x, settings.seeds[0])
        for x in settings.lambdas
        if x != lam
    ]
    for seed in settings.seeds:
        runs.append(
            RunSpec(f"v2_auto_lambda{lam:g}_harden{at}_seed{seed}", "v2", "auto", lam, seed, at)
        )
        runs.append(arm_spec("v2", "ten_passes", seed, settings))
    # Screening: every arm on v2, seed by seed (partial results stay paired).
    for seed in settings.seeds:
        runs += [arm_spec("v2", arm, seed, settings) for arm in settings.arms]
    # The verdict: the finalists on both nets over more seeds, with their manual nets.
    if settings.finalists:
        for seed in settings.verdict_seeds:
            for model in ("v2", "v1"):
                runs.append(RunSpec(f"{model}_manual_seed{seed}", model, "manual", 0.0, seed))
                runs += [arm_spec(model, arm, seed, settings) for arm in settings.finalists]
            runs.append(arm_spec("v1", "ten_passes", seed, settings))
    for seed in settings.more_seeds:
        runs.append(RunSpec(f"v2_manual_seed{seed}", "v2", "manual", 0.0, seed))
        runs += [arm_spec("v2", arm, seed, settings) for arm in settings.finalists]
    unique = {}
    for spec in runs:
        unique.setdefault(spec.name, spec)
    return list(unique.values())


def arm_spec(model, arm, seed, settings):
    """The run of `arm` (a key of ARMS) for `model` and `seed`: lambda = the study's
    penalty, `sinkhorn_iterations` passes per step."""
    k, lam = settings.sinkhorn_iterations, settings.penalty
    if arm == "ten_passes":
        name = f"{model}_auto_lambda{lam:g}_sinkhorn{k}_seed{seed}"
        return RunSpec(name, model, "auto", lam, seed, sinkhorn_iterations=k, arm=arm)
    options = dict(ARMS[arm])
    if "search_epochs" in options and options["search_epochs"] is None:
        options["search_epochs"] = settings.search_epochs
    name = f"{model}_{arm}_seed{seed}"
    return RunSpec(name, model, "auto", lam, seed, sinkhorn_iterations=k, arm=arm, **options)


def arm_of(row, settings):
    """The arm of a run row: recorded by runs since the arms; derived for older rows."""
    if row.get("arm"):
        return row["arm"]
    if row["shuffle"] == "manual":
        return "manual"
    if row["harden_at_epoch"] is not None:
        return f"harden{row['harden_at_epoch']}"
    passes = row.get("sinkhorn_iterations", 1)
    if row["lambda"] != settings.penalty:
        return f"paper_lambda{row['lambda']:g}"
    return "paper" if passes == 1 else "ten_passes"


def study(settings, output_dir, log=print, jobs=1, train=True):
    """Runs the study (resuming) and writes results.json, report.md and the pictures.

    With `train=False` nothing is trained: the report covers the runs finished so far
    (their rows in `runs/<name>/result.json`), e.g. while the study still runs.
    """
    start = time.time()
    plots.check_available()  # the report's pictures: a missing extra fails before training
    # Seeds, arms, finalists and more seeds only add runs: the study is what this call and
    # the earlier ones asked for, recorded before training, so a resume or `--report-only`
    # without an earlier call's flags (or after a kill) keeps its runs.
    settings = with_recorded_runs(settings, output_dir)
    os.makedirs(output_dir, exist_ok=True)
    if train:
        record_plan(settings, output_dir)
    train_data, test_data = data.load(
        settings.dataset, seed=settings.seeds[0], data_dir=settings.data_dir
    )
    train_images = min(train_data.num_examples, settings.max_train_examples or np.inf)
    runs_dir = os.path.join(output_dir, "runs")
    todo = specs(settings)
    if not train:
        todo = [s for s in todo if os.path.exists(os.path.join(runs_dir, s.name, "result.json"))]
    rows = run_all(settings, todo, runs_dir, log, jobs)
    runs = [_public(row, settings) for row in rows.values()]
    results = {
        "dataset": settings.dataset,
        "train_images": int(train_images),
        "test_images": int(test_data.num_examples),
        "settings": dataclasses.asdict(settings),
        "runs": runs,
        "runs_planned": len(specs(settings)),
        "summary": summarize(runs, settings),
        "verdict": verdict(runs, settings.harden_at_epoch),
        "wall_seconds_this_invocation": time.time() - start,
    }
    results["figures"] = _figures(rows, settings, output_dir, results["verdict"])
    write_json(os.path.join(output_dir, "results.json"), results)
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(render_report(results))
    return results


# What defines the study's runs: a rerun into a folder whose results.json recorded other
# values would mix two studies in one report (seeds, arms and finalists only add runs).
RUN_DEFINING = (
    "dataset",
    "max_train_examples",
    "epochs",
    "batch_size",
    "learning_rate",
    "v1_width",
    "v2_width",
    "penalty",
    "harden_at_epoch",
    "sinkhorn_iterations",
    "padding",
    "search_epochs",
)


# Settings that only add runs: a study unites the recorded ones with those given.
RUN_ADDING = ("seeds", "lambdas", "arms", "finalists", "verdict_seeds", "more_seeds")
# More values than a study could ever train is a tampered file, not a plan.
MAX_RECORDED_VALUES = 1000


def with_recorded_runs(settings, output_dir):
    """`settings` checked against `output_dir`'s results.json (check_recorded_settings),
    each run-adding setting united with the recorded one (recorded values first: the
    lambda sweep keeps its seed, `seeds[0]`)."""
    recorded = check_recorded_settings(settings, output_dir)
    if recorded is None:
        return settings
    path = os.path.join(output_dir, "results.json")
    united = {}
    for name in RUN_ADDING:
        values = recorded.get(name, [])  # absent from studies recorded before the setting
        if (
            not isinstance(values, list)
            or len(values) > MAX_RECORDED_VALUES
            or not all(isinstance(x, (int, float, str)) for x in values)
        ):
            raise RunDirectoryError(
                f"{path}: settings.{name} must be a list of at most {MAX_RECORDED_VALUES} "
                f"numbers or names. Received: {str(values)[:120]}"
            )
        united[name] = tuple(dict.fromkeys((*values, *getattr(settings, name))))
    try:
        return dataclasses.replace(settings, **united)
    except ValueError as error:
        raise RunDirectoryError(f"{path}: its recorded settings are refused: {error}") from None


def record_plan(settings, output_dir):
    """Writes `settings` into results.json (atomically, the last report kept) before any
    training, so that runs asked for by this call stay in the study after a kill."""
    path = os.path.join(output_dir, "results.json")
    results = read_json(path, "study results") if os.path.exists(path) else {}
    write_json(path, {**results, "settings": dataclasses.asdict(settings)})


def recorded_differences(given, output_dir):
    """Of `given` ({setting: value}), those that differ from what defines the runs of the
    study `output_dir`'s results.json recorded, as 'name=value (recorded: value)'."""
    recorded = check_recorded_settings(None, output_dir)
    if recorded is None:
        return []
    return [
        f"{k}={v!r} (recorded: {recorded[k]!r})"
        for k, v in given.items()
        if k in RUN_DEFINING and as_json(v) != recorded[k]
    ]


def check_recorded_settings(settings, output_dir):
    """Refuses settings that differ from those `output_dir`'s results.json recorded;
    returns the recorded settings (None where there are none; `settings` None: only
    checks the file)."""
    path = os.path.join(output_dir, "results.json")
    if not os.path.exists(path):
        return None
    recorded = read_json(path, "study results")
    recorded = recorded.get("settings") if isinstance(recorded, dict) else None
    if not isinstance(recorded, dict):
        raise RunDirectoryError(
            f"{path} is not a study's results (no 'settings' dict); move it away to start a "
            f"new study there. Received: {str(recorded)[:120]}"
        )
    missing = [k for k in RUN_DEFINING if k not in recorded]
    if missing:
        raise RunDirectoryError(
            f"{path} does not record what defines its runs, so they cannot be told apart "
            f"from another study's; move it away to start a new study there. Missing: {missing}"
        )
    if settings is None:
        return recorded
    current = dataclasses.asdict(settings)
    differ = [k for k in RUN_DEFINING if recorded[k] != current[k]]
    if differ:
        raise other_settings(
            output_dir, [f"{k}={current[k]!r} (recorded: {recorded[k]!r})" for k in differ]
        )
    return recorded


def other_settings(output_dir, differences):
    """The RunDirectoryError of a study asked for with other settings than it recorded."""
    return RunDirectoryError(
        f"{output_dir} holds a study run with other settings; its report would mix two "
        "studies. Use the recorded values or another --output. Received: " + ", ".join(differences)
    )


_PUBLIC = (
    "model",
    "shuffle",
    "lambda",
    "seed",
    "epochs",
    "harden_at_epoch",
    "sinkhorn_iterations",
    "shuffle_initializer",
    "shuffle_forward",
    "search_epochs",
    "balanced",
    "search_penalty",
    "relaxed_accuracy",
    "rounded_accuracy",
    "final_accuracy",
    "penalty",
    "routing_difference",
    "seconds",
    "name",
)


# Entries of rows written before the arms existed: what those runs did.
_BEFORE_ARMS = {
    "sinkhorn_iterations": 1,  # before the Sinkhorn runs: Algorithm 1's single pass
    "shuffle_initializer": "random",
    "shuffle_forward": "relaxed",
    "search_epochs": None,
    "balanced": False,
    "search_penalty": None,
}


def _public(row, settings=None):
    public = {key: row.get(key, _BEFORE_ARMS.get(key)) for key in _PUBLIC}
    if "equals_manual" in row:
        public["equals_manual"] = row["equals_manual"]
    else:
        public["equals_manual"] = row["routing_difference"] == 0.0
    public["arm"] = arm_of(row, settings or StudySettings())
    return public


def _mean_std(values):
    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if not values.size:
        return None
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "n": int(values.size),
        "values": values.tolist(),
    }


def summarize(runs, settings):
    """Means and standard deviations over seeds (accuracies as fractions)."""
    lam, at = settings.penalty, settings.harden_at_epoch

    def select(**match):
        return [r for r in runs if all(r[k] == v for k, v in match.items())]

    def plain_auto(model):  # Algorithm 1 as the paper: one pass, rounded at the end
        return select(model=model, shuffle="auto", harden_at_epoch=None, sinkhorn_iterations=1)

    summary = {"comparison": {}, "lambda_sweep": [], "early_hardening": {}, "sinkhorn": {}}
    for model in ("v1", "v2"):
        manual = {r["seed"]: r for r in select(model=model, shuffle="manual")}
        auto = {r["seed"]: r for r in plain_auto(model) if r["lambda"] == lam}
        paired = sorted(set(manual) & set(auto))
        summary["comparison"][model] = {
            "manual": _mean_std(r["final_accuracy"] for r in manual.values()),
            "auto_relaxed": _mean_std(r["relaxed_accuracy"] for r in auto.values()),
            "auto_rounded": _mean_std(r["rounded_accuracy"] for r in auto.values()),
            "rounding_change": _mean_std(
                r["rounded_accuracy"] - r["relaxed_accuracy"] for r in auto.values()
            ),
            "auto_minus_manual": _mean_std(
                auto[s]["rounded_accuracy"] - manual[s]["final_accuracy"] for s in paired
            ),
            "penalty": _mean_std(r["penalty"] for r in auto.values()),
            "routing_difference": _mean_std(r["routing_difference"] for r in auto.values()),
        }
    for x in settings.lambdas:
        rows = [r for r in plain_auto("v2") if r["lambda"] == x]
        summary["lambda_sweep"].append(
            {
                "lambda": x,
                "relaxed": _mean_std(r["relaxed_accuracy"] for r in rows),
                "rounded": _mean_std(r["rounded_accuracy"] for r in rows),
                "rounding_change": _mean_std(
                    r["rounded_accuracy"] - r["relaxed_accuracy"] for r in rows
                ),
                "penalty": _mean_std(r["penalty"] for r in rows),
            }
        )
    early = select(model="v2", shuffle="auto", harden_at_epoch=at)
    plain = {r["seed"]: r for r in plain_auto("v2") if r["lambda"] == lam}
    summary["early_hardening"] = {
        "plain_rounded": _mean_std(
            plain[r["seed"]]["rounded_accuracy"] for r in early if r["seed"] in plain
        ),
        "early_final": _mean_std(r["final_accuracy"] for r in early),
    }
    k = settings.sinkhorn_iterations
    passes = {r["seed"]: r for r in select(model="v2", arm="ten_passes")}
    paired = sorted(set(passes) & set(plain))
    manual_v2 = {r["seed"]: r for r in select(model="v2", shuffle="manual")}
    summary["sinkhorn"] = {
        "iterations": k,
        "relaxed": _mean_std(r["relaxed_accuracy"] for r in passes.values()),
        "rounded": _mean_std(r["rounded_accuracy"] for r in passes.values()),
        "rounding_change": _mean_std(
            r["rounded_accuracy"] - r["relaxed_accuracy"] for r in passes.values()
        ),
        "penalty": _mean_std(r["penalty"] for r in passes.values()),
        "minus_one_pass": _mean_std(
            passes[x]["rounded_accuracy"] - plain[x]["rounded_accuracy"] for x in paired
        ),
        "minus_manual": _mean_std(
            r["rounded_accuracy"] - manual_v2[x]["final_accuracy"]
            for x, r in passes.items()
            if x in manual_v2
        ),
    }
    return summary


# The arms the verdict weighs (the lambda sweep and early hardening are the paper's
# study, not candidates for the default).
VERDICT_ARMS = ("paper", "harden{}", *ARMS)
# A candidate default keeps rounding within this many points (the target).
ROUNDING_TOLERANCE = 0.2
# ... and a paired difference to manual whose 95% interval starts above this (points).
TARGET_CI_LOW = -0.3


def verdict(runs, harden_at_epoch=8):
    """Each arm against the manual shuffle of the same net and seed, in points.

    Per net and arm: `n` paired seeds, `accuracy` (mean final accuracy), `diff_mean`
    and its 95% Student-t interval `ci_low`, `ci_high`, the sign count, the mean
    rounding change, P(M), routing difference and how many nets equal the manual
    counts. `recommended`: per net, the arm with the highest `ci_low` among those that
    meet the target (at least 3 seeds, `ci_low` >= TARGET_CI_LOW, rounding change within
    ROUNDING_TOLERANCE) with the most seeds; none where no arm meets it (the manual
    shuffle stays the choice).
    """
    entries = []
    for model in ("v2", "v1"):
        manual = {r["seed"]: r for r in runs if r["model"] == model and r["arm"] == "manual"}
        for arm in (a.format(harden_at_epoch) for a in VERDICT_ARMS):
            rows = [
                r for r in runs if r["model"] == model and r["arm"] == arm and r["seed"] in manual
            ]
            if not rows:
                continue
            rows.sort(key=lambda r: r["seed"])
            diffs = np.array(
                [100 * (r["final_accuracy"] - manual[r["seed"]]["final_accuracy"]) for r in rows]
            )
            changes = [
                100 * (r["rounded_accuracy"] - r["relaxed_accuracy"])
                for r in rows
                if r["rounded_accuracy"] is not None and r["relaxed_accuracy"] is not None
            ]
            low, high = _t_interval(diffs)
            entries.append(
                {
                    "model": model,
                    "arm": arm,
                    "n": len(rows),
                    "seeds": [r["seed"] for r in rows],
                    "accuracy": float(100 * np.mean([r["final_accuracy"] for r in rows])),
                    "accuracy_std": _std(100 * np.array([r["final_accuracy"] for r in rows])),
                    "diff_mean": float(diffs.mean()),
                    "diff_std": _std(diffs),
                    "ci_low": low,
                    "ci_high": high,
                    "wins": int(np.sum(diffs > 0)),
                    "losses": int(np.sum(diffs < 0)),
                    "rounding_change": float(np.mean(changes)) if changes else None,
                    # P(M) where the routing was chosen (the search's hardening, if any).
                    "penalty": float(np.mean([_rounding_penalty(r) for r in rows])),
                    "routing_difference": float(np.mean([r["routing_difference"] for r in rows])),
                    "equals_manual": int(sum(bool(r["equals_manual"]) for r in rows)),
                    # The bar for a default: CI above -0.3 points, rounding free.
                    "meets_target": low is not None
                    and low >= TARGET_CI_LOW
                    and abs(float(np.mean(changes)) if changes else 0.0) <= ROUNDING_TOLERANCE,
                    "recommended": False,
                }
            )
    for model in ("v2", "v1"):
        candidates = [
            e for e in entries if e["model"] == model and e["n"] >= 3 and e["meets_target"]
        ]
        if candidates:
            most = max(e["n"] for e in candidates)
            best = max((e for e in candidates if e["n"] == most), key=lambda e: e["ci_low"])
            best["recommended"] = True
    return entries


def _rounding_penalty(row):
    searched = row.get("search_penalty")
    return row["penalty"] if searched is None else searched


def _std(values):
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _t_interval(values, level=0.95):
    """The Student-t confidence interval of the mean (None for fewer than 2 values)."""
    from scipy import stats

    if len(values) < 2:
        return None, None
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * stats.sem(values)
    return float(values.mean() - half), float(values.mean() + half)


def _figures(rows, settings, output_dir, verdict_entries):
    figures = {}
    sweep = sorted(
        (
            r
            for r in rows.values()
            if r["model"] == "v2"
            and r["shuffle"] == "auto"
            and r["harden_at_epoch"] is None
            and r.get("sinkhorn_iterations", 1) == 1
        ),
        key=lambda r: (r["lambda"], r["seed"]),
    )
    if sweep:
        figures["lambda_sweep"] = plots.plot_lambda_sweep(
            sweep, os.path.join(output_dir, "lambda_sweep.png"), "ShuffleNet v2, Fashion-MNIST"
        )
    for model in ("v2", "v1"):
        # The first seed of: the paper's routing (one pass, random start), the verdict's
        # recommended arm (if any) and the routing chosen for speed; the manual counts last.
        chosen = [e["arm"] for e in verdict_entries if e["model"] == model and e["recommended"]]
        headings = {"paper": "learned (paper)"}
        headings.update({arm: f"{arm} (recommended)" for arm in chosen if arm != "paper"})
        headings.setdefault("balanced_fixed", "balanced_fixed (for speed)")
        columns = [
            (heading, row)
            for arm, heading in headings.items()
            if (row := _first_seed(rows, settings, model, arm)) is not None
        ]
        if columns:
            keep = 3 if model == "v2" else 2
            figures[f"routing_{model}"] = plots.plot_routing(
                [(heading, _routing_entries(row)[:keep]) for heading, row in columns],
                os.path.join(output_dir, f"routing_{model}.png"),
                f"ShuffleNet {model}: learned vs manual routing counts",
            )
    return {k: os.path.basename(v) for k, v in figures.items()}


def _first_seed(rows, settings, model, arm):
    """The row of `arm` for `model` with the lowest seed (None if there is none)."""
    matching = [
        r
        for r in rows.values()
        if r["model"] == model and r.get("routing") and arm_of(r, settings) == arm
    ]
    return min(matching, key=lambda r: r["seed"]) if matching else None


def _routing_entries(row):
    return [
        {k: np.asarray(v) if k in ("counts", "manual") else v for k, v in entry.items()}
        for entry in row["routing"]
    ]


def _fmt(stat, scale=100.0, digits=2):
    if stat is None:
        return "-"
    if stat["n"] == 1:
        return f"{scale * stat['mean']:.{digits}f}"
    return f"{scale * stat['mean']:.{digits}f} ± {scale * stat['std']:.{digits}f}"


def _n(stat):
    return stat["n"] if stat else 0


def render_report(results):
    """The tables of the study (mean ± standard deviation over seeds, in %)."""
    s, summary = results["settings"], results["summary"]
    lines = [
        "# AutoShuffleNet on Fashion-MNIST",
        "",
        *render_verdict(results.get("verdict", [])),
        f"{results['train_images']} training images, the full {results['test_images']}-image "
        f"test set; {s['epochs']} epochs, batch {s['batch_size']}, lr {s['learning_rate']} "
        f"(linear decay), v1 g=3 width {s['v1_width']}, v2 width {s['v2_width']}, lambda "
        f"{s['penalty']:g}, seeds {list(s['seeds'])}, CIFAR stem, padding "
        f"{s.get('padding', 'same')!r}. Accuracies in %, mean ± standard "
        "deviation over seeds (n = number of runs).",
        "",
        f"**{len(results['runs'])} of {results['runs_planned']} planned runs are finished**"
        + (
            " (the study is still running or was stopped; rerunning it resumes)."
            if len(results["runs"]) < results["runs_planned"]
            else "."
        ),
        "",
        "## Manual vs learned shuffle (paper Tables 1 and 3)",
        "",
        "| model | manual | learned, relaxed | learned, rounded | rounding change (points) "
        "| learned - manual (points, paired by seed) | P(M) at rounding | routing differing "
        "from manual | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, row in summary["comparison"].items():
        n = row["auto_rounded"]["n"] if row["auto_rounded"] else 0
        lines.append(
            f"| {model}{' g3' if model == 'v1' else ''} | {_fmt(row['manual'])} "
            f"| {_fmt(row['auto_relaxed'])} | {_fmt(row['auto_rounded'])} "
            f"| {_fmt(row['rounding_change'])} | {_fmt(row['auto_minus_manual'])} "
            f"| {_fmt(row['penalty'], 1.0, 3)} | {_fmt(row['routing_difference'])} | {n} |"
        )
    lines += [
        "",
        "## Effect of lambda (paper Table 5; ShuffleNet v2)",
        "",
        "| lambda | relaxed | rounded | rounding change (points) | P(M) at rounding | n |",
        "|---|---|---|---|---|---|",
    ]
    for row in summary["lambda_sweep"]:
        n = row["rounded"]["n"] if row["rounded"] else 0
        lines.append(
            f"| {row['lambda']:g} | {_fmt(row['relaxed'])} | {_fmt(row['rounded'])} "
            f"| {_fmt(row['rounding_change'])} | {_fmt(row['penalty'], 1.0, 3)} | {n} |"
        )
    early = summary["early_hardening"]
    lines += [
        "",
        "## Plain rounding at the end vs hardening early, then fine-tuning (ShuffleNet v2)",
        "",
        "| method | final accuracy (exact permutations) | n |",
        "|---|---|---|",
        f"| round after epoch {s['epochs']} (the paper; the seeds hardened early) "
        f"| {_fmt(early['plain_rounded'])} | {_n(early['plain_rounded'])} |",
        f"| harden after epoch {s['harden_at_epoch']}, fine-tune to epoch {s['epochs']} "
        f"| {_fmt(early['early_final'])} | {_n(early['early_final'])} |",
        "",
        f"## One constraint pass per step (the paper) vs {summary['sinkhorn']['iterations']} "
        "(ShuffleNet v2)",
        "",
        "| passes | relaxed | rounded | rounding change (points) | P(M) at rounding "
        "| rounded - one pass (points, paired by seed) | rounded - manual (paired) | n |",
        "|---|---|---|---|---|---|---|---|",
        f"| 1 (Algorithm 1) | {_fmt(summary['comparison']['v2']['auto_relaxed'])} "
        f"| {_fmt(summary['comparison']['v2']['auto_rounded'])} "
        f"| {_fmt(summary['comparison']['v2']['rounding_change'])} "
        f"| {_fmt(summary['comparison']['v2']['penalty'], 1.0, 3)} | "
        f"| {_fmt(summary['comparison']['v2']['auto_minus_manual'])} "
        f"| {_n(summary['comparison']['v2']['auto_rounded'])} |",
        f"| {summary['sinkhorn']['iterations']} | {_fmt(summary['sinkhorn']['relaxed'])} "
        f"| {_fmt(summary['sinkhorn']['rounded'])} "
        f"| {_fmt(summary['sinkhorn']['rounding_change'])} "
        f"| {_fmt(summary['sinkhorn']['penalty'], 1.0, 3)} "
        f"| {_fmt(summary['sinkhorn']['minus_one_pass'])} "
        f"| {_fmt(summary['sinkhorn']['minus_manual'])} | {_n(summary['sinkhorn']['rounded'])} |",
        "",
        "## Pictures",
        "",
        "Routing counts (first seed of each): the paper's learned routing and the verdict's "
        "recommended arm, once there is one, beside the manual counts.",
        "",
    ]
    for key, name in results["figures"].items():
        lines += [f"![{key}]({name})", ""]
    return "\n".join(lines)


def render_verdict(entries):
    """The verdict table: each arm minus the manual shuffle, paired by seed (points)."""
    lines = [
        "## Verdict: each way to learn the shuffle against the manual one",
        "",
        "Final accuracy on exact permutations, and its difference to the manual net of the "
        "same seed in points with the 95% Student-t interval over seeds; wins/losses count "
        "seeds. Rounding change: rounded minus relaxed (0 for arms whose net has no relaxed "
        "phase). Equal to manual: nets whose routing counts are the manual counts (the "
        "manual function class). P(M) at rounding: for searched arms, at the search's "
        "hardening (for balanced_fixed, the fresh net's matrices). Meets target: CI lower "
        "bound at least -0.3 points and "
        "rounding change within 0.2 points. Recommended: per net, among the arms that meet the "
        "target with at least 3 seeds, the best lower bound; none where no arm meets it (the "
        "manual shuffle stays the builders' default).",
        "",
        "| net | arm | n | accuracy | - manual | 95% CI | wins/losses | rounding change "
        "| P(M) at rounding | routing differing | equal to manual | meets target | recommended |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        ci = "-" if e["ci_low"] is None else f"[{e['ci_low']:+.2f}, {e['ci_high']:+.2f}]"
        spread = "" if e["accuracy_std"] is None else f" ± {e['accuracy_std']:.2f}"
        diff = "" if e["diff_std"] is None else f" ± {e['diff_std']:.2f}"
        change = "-" if e["rounding_change"] is None else f"{e['rounding_change']:+.2f}"
        lines.append(
            f"| {e['model']}{' g3' if e['model'] == 'v1' else ''} | {e['arm']} | {e['n']} "
            f"| {e['accuracy']:.2f}{spread} | {e['diff_mean']:+.2f}{diff} | {ci} "
            f"| {e['wins']}/{e['losses']} | {change} | {e['penalty']:.3g} "
            f"| {100 * e['routing_difference']:.1f}% | {e['equals_manual']}/{e['n']} "
            f"| {'yes' if e['meets_target'] else 'no'} | {'yes' if e['recommended'] else ''} |"
        )
    return [*lines, ""]
