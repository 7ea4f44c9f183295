"""The Fashion-MNIST study on tiny IDX files: every run, the summary against NumPy, and a
rerun that reads finished runs back instead of training them again. The runs train the
tiny nets of tests/helpers.py (the study's code is the same for every net size); the
arms' own pieces are tests/test_arms.py's."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import _write_fashion, use_tiny_builders

from experiments import runs, study
from keras_autoshuffle.training import RunDirectoryError


def test_specs_cover_the_comparison_the_sweep_early_hardening_and_sinkhorn():
    settings = study.StudySettings(seeds=(0, 1), lambdas=(0.0, 1e-3, 5e-2), penalty=5e-2)
    names = [spec.name for spec in study.specs(settings)]
    # The comparison, the sweep, early hardening and ten passes per seed, then the arms.
    assert len(names) == len(set(names)) == 2 * 4 + 2 + 2 + 2 + 2 * len(settings.arms)
    assert "v1_auto_lambda0.05_seed1" in names and "v2_auto_lambda0_seed0" in names
    assert "v2_auto_lambda0.05_harden8_seed1" in names
    sinkhorn = [spec for spec in study.specs(settings) if "sinkhorn" in spec.name]
    assert [(s.name, s.sinkhorn_iterations, s.penalty) for s in sinkhorn] == [
        ("v2_auto_lambda0.05_sinkhorn10_seed0", 10, 5e-2),
        ("v2_auto_lambda0.05_sinkhorn10_seed1", 10, 5e-2),
    ]
    with pytest.raises(ValueError, match="Received: lambdas"):
        study.StudySettings(lambdas=(0.0, 1e-3))
    with pytest.raises(ValueError, match="Received: seeds"):
        study.StudySettings(seeds=())
    for passes in (1, 0, "10"):  # 1 would repeat the comparison's one-pass runs
        with pytest.raises(ValueError, match=f"Received: sinkhorn_iterations={passes!r}"):
            study.StudySettings(sinkhorn_iterations=passes)
    # Rows written before the ten-pass runs existed ran one pass.
    old = {
        k: v for k, v in _row("v2", "auto", 5e-2, 0, 0.9, 0.9).items() if k != "sinkhorn_iterations"
    }
    assert study._public(old)["sinkhorn_iterations"] == 1


def _row(model, shuffle, lam, seed, relaxed, rounded, harden=None, passes=1):
    return {
        "model": model, "shuffle": shuffle, "lambda": lam, "seed": seed, "epochs": 10,
        "harden_at_epoch": harden, "sinkhorn_iterations": passes, "relaxed_accuracy": relaxed,
        "rounded_accuracy": rounded, "final_accuracy": rounded, "penalty": 1.0,
        "routing_difference": 0.5, "seconds": 1.0,
        "name": f"{model}_{shuffle}_{lam}_{seed}_{harden}_{passes}",
    }  # fmt: skip


def test_summary_means_and_spreads_match_numpy():
    settings = study.StudySettings(seeds=(0, 1, 2), lambdas=(0.0, 5e-2), penalty=5e-2)
    manual = [0.90, 0.91, 0.93]
    auto = [0.92, 0.90, 0.95]
    runs = [_row("v2", "manual", 0.0, s, m, m) for s, m in enumerate(manual)]
    runs += [_row("v2", "auto", 5e-2, s, a + 0.01, a) for s, a in enumerate(auto)]
    # Ten passes per step: kept out of the comparison, compared with one pass by seed.
    passes = [0.93, 0.92, 0.94]
    runs += [_row("v2", "auto", 5e-2, s, p, p, passes=10) for s, p in enumerate(passes)]
    # As study.study() passes them: the public rows, each with its arm.
    summaries = study.summarize([study._public(row, settings) for row in runs], settings)
    summary = summaries["comparison"]["v2"]
    difference = np.subtract(auto, manual)
    assert summary["auto_minus_manual"]["mean"] == pytest.approx(difference.mean())
    assert summary["auto_minus_manual"]["std"] == pytest.approx(difference.std(ddof=1))
    assert summary["rounding_change"]["mean"] == pytest.approx(-0.01)
    assert summary["manual"]["n"] == summary["auto_rounded"]["n"] == 3
    sinkhorn = summaries["sinkhorn"]
    assert sinkhorn["minus_one_pass"]["mean"] == pytest.approx(np.subtract(passes, auto).mean())
    assert sinkhorn["minus_one_pass"]["std"] == pytest.approx(np.subtract(passes, auto).std(ddof=1))
    assert sinkhorn["rounding_change"]["mean"] == pytest.approx(0.0)
    assert sinkhorn["minus_manual"]["mean"] == pytest.approx(np.subtract(passes, manual).mean())


@pytest.mark.lab
@pytest.mark.slow
def test_tiny_study_runs_and_resumes(tmp_path, monkeypatch):
    use_tiny_builders(monkeypatch)
    _write_fashion(tmp_path / "data", num_train=64, num_test=32)
    # The paper's runs; the arms (tests/test_arms.py) left out. `search_epochs` must be
    # below `epochs` all the same.
    settings = study.StudySettings(
        max_train_examples=64, epochs=2, batch_size=32, seeds=(0,), lambdas=(0.0, 5e-2),
        penalty=5e-2, harden_at_epoch=1, data_dir=str(tmp_path / "data"), arms=(),
        search_epochs=1,
    )  # fmt: skip
    out = tmp_path / "study"
    results = study.study(settings, str(out))
    assert (results["train_images"], results["test_images"]) == (64, 32)
    assert len(results["runs"]) == len(study.specs(settings)) == 7
    for row in results["runs"]:
        assert set(row) >= {"model", "shuffle", "lambda", "seed", "epochs", "relaxed_accuracy",
                            "rounded_accuracy", "penalty", "seconds"}  # fmt: skip
        assert 0 <= row["rounded_accuracy"] <= 1
    for name in ("report.md", "results.json", "lambda_sweep.png", "routing_v1.png"):
        assert (out / name).stat().st_size > 0, name
    # A rerun trains nothing: every row comes back from its result.json.
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.keras")}
    again = study.study(settings, str(out))
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.keras")} == before
    assert json.dumps(again["runs"], sort_keys=True) == json.dumps(results["runs"], sort_keys=True)
    # A report of the finished runs only, while others are still to run.
    (out / "runs" / "v1_manual_seed0" / "result.json").unlink()
    partial = study.study(settings, str(out), train=False)
    assert len(partial["runs"]) == 6 and partial["runs_planned"] == 7
    report = (out / "report.md").read_text()
    assert "6 of 7 planned runs are finished" in report
    assert partial["summary"]["sinkhorn"]["rounded"]["n"] == 1  # the ten-pass row is filled
    assert "| 10 | -" not in report


def _committed_row(name="v2_manual_seed0"):
    """A row of the committed study (docs/fashion_mnist/runs), as the study wrote it."""
    return json.loads((DOCS_RUNS / name / "result.json").read_text())


DOCS_RUNS = Path(__file__).resolve().parent.parent / "docs" / "fashion_mnist" / "runs"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"final_accuracy": float("nan")}, "invalid final_accuracy.*Received: final_accuracy=nan"),
        ({"final_accuracy": 17.0}, "invalid final_accuracy.*Received: final_accuracy=17.0"),
        ({"rounded_accuracy": "0.9"}, "invalid rounded_accuracy"),
        ({"seed": True}, "invalid seed"),
        ({"seconds": -1.0}, "invalid seconds"),
        ({"balanced": "no"}, "invalid balanced"),
        ({"final_accuracy": None}, "invalid final_accuracy"),
        ({"final_accuracy": "drop"}, "lacks final_accuracy"),
        # Another seed's row copied over this run's (its name and seed inside unchanged).
        (_committed_row("v2_manual_seed1"), r"not the row of run v2_manual_seed0.*seed=1"),
        ({"epochs": 5}, r"epochs=5 \(the run's: 10\)"),
        ([1, 2], "is not an object"),
    ],
)
def test_a_result_row_is_checked_and_refused_naming_its_file(tmp_path, change, message):
    settings = study.StudySettings()
    spec = next(s for s in study.specs(settings) if s.name == "v2_manual_seed0")
    folder = tmp_path / spec.name
    folder.mkdir()
    path = folder / "result.json"
    row = _committed_row()
    path.write_text(json.dumps(row))
    assert (
        runs.run_one(settings, None, spec, str(folder))["final_accuracy"] == row["final_accuracy"]
    )
    if isinstance(change, dict) and "name" not in change:
        row = {k: v for k, v in {**row, **change}.items() if v != "drop"}
    else:
        row = change
    path.write_text(json.dumps(row))
    with pytest.raises(RunDirectoryError, match=f"{re.escape(str(path))}.*{message}"):
        runs.run_one(settings, None, spec, str(folder))


def test_a_truncated_result_row_is_named(tmp_path):
    settings = study.StudySettings()
    spec = study.specs(settings)[0]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(_committed_row(spec.name))[:100])
    with pytest.raises(RunDirectoryError, match=f"result row file {re.escape(str(path))} is dam"):
        runs.run_one(settings, None, spec, str(tmp_path))


def test_every_committed_row_passes_its_check():
    settings = study.with_recorded_runs(study.StudySettings(), str(DOCS_RUNS.parent))
    specs = {spec.name: spec for spec in study.specs(settings)}
    for folder in sorted(DOCS_RUNS.iterdir()):
        path = folder / "result.json"
        runs.check_row(str(path), json.loads(path.read_text()), specs[folder.name], settings)


HUGE = 10**400  # JSON holds integers of any length; a float does not


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lambda": HUGE}, r"invalid lambda.*Received: lambda=1000000000"),
        ({"final_accuracy": -HUGE}, r"invalid final_accuracy.*Received: final_accuracy=-1000"),
        ({"seconds": HUGE}, r"invalid seconds.*Received: seconds=1000"),
        ({"search_penalty": HUGE}, r"invalid search_penalty"),
        ({"seed": HUGE}, r"not the row of run v2_manual_seed0.*seed=1000"),
        ({"name": "x" * 100000}, r"not the row of run v2_manual_seed0.*name='xxx"),
        ({"harden_at_epoch": HUGE}, r"invalid harden_at_epoch \(at most epochs - 1 = 9\)"),
        ({"harden_at_epoch": 10}, r"invalid harden_at_epoch.*Received: harden_at_epoch=10$"),
        ({"routing": [1, "x"]}, r"invalid routing.*Received: routing=\[1, 'x'\]"),
        ({"history": {"loss": [0.5, "x"]}}, r"invalid history"),
        ({"history": {"loss": 0.5}}, r"invalid history"),
        ({"relative_change": float("inf")}, r"invalid relative_change"),
        ({"equals_manual": 1}, r"invalid equals_manual"),
    ],
)
def test_huge_numbers_and_garbage_in_a_row_are_named_and_cut_short(tmp_path, change, message):
    settings = study.StudySettings()
    spec = next(s for s in study.specs(settings) if s.name == "v2_manual_seed0")
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**_committed_row(), **change}))
    with pytest.raises(RunDirectoryError, match=f"{re.escape(str(path))}") as caught:
        runs.run_one(settings, None, spec, str(tmp_path))
    assert re.search(message, str(caught.value), flags=re.S)
    assert len(str(caught.value)) < len(str(path)) + 600  # each value cut to 200 characters
    # A diverged training logs NaN: its history is a row's as any other.
    row = {**_committed_row(), "history": {"loss": [float("nan"), float("inf"), 1]}}
    assert runs.check_row(str(path), row, spec, settings) is row
