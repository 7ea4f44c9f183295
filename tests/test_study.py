"""The Fashion-MNIST study on tiny IDX files: every run, the summary against NumPy, and a
rerun that reads finished runs back instead of training them again."""

import json

import numpy as np
import pytest
from helpers import _write_fashion

from keras_autoshuffle.experiments import study


def test_specs_cover_the_comparison_the_sweep_and_early_hardening():
    settings = study.StudySettings(seeds=(0, 1), lambdas=(0.0, 1e-3, 5e-2), penalty=5e-2)
    names = [spec.name for spec in study.specs(settings)]
    assert len(names) == len(set(names)) == 2 * 4 + 2 + 2
    assert "v1_auto_lambda0.05_seed1" in names and "v2_auto_lambda0_seed0" in names
    assert "v2_auto_lambda0.05_harden8_seed1" in names
    with pytest.raises(ValueError, match="Received: lambdas"):
        study.StudySettings(lambdas=(0.0, 1e-3))
    with pytest.raises(ValueError, match="Received: seeds"):
        study.StudySettings(seeds=())


def _row(model, shuffle, lam, seed, relaxed, rounded, harden=None):
    return {
        "model": model, "shuffle": shuffle, "lambda": lam, "seed": seed, "epochs": 10,
        "harden_at_epoch": harden, "relaxed_accuracy": relaxed, "rounded_accuracy": rounded,
        "final_accuracy": rounded, "penalty": 1.0, "routing_difference": 0.5, "seconds": 1.0,
        "name": f"{model}_{shuffle}_{lam}_{seed}_{harden}",
    }  # fmt: skip


def test_summary_means_and_spreads_match_numpy():
    settings = study.StudySettings(seeds=(0, 1, 2), lambdas=(0.0, 5e-2), penalty=5e-2)
    manual = [0.90, 0.91, 0.93]
    auto = [0.92, 0.90, 0.95]
    runs = [_row("v2", "manual", 0.0, s, m, m) for s, m in enumerate(manual)]
    runs += [_row("v2", "auto", 5e-2, s, a + 0.01, a) for s, a in enumerate(auto)]
    summary = study.summarize(runs, settings)["comparison"]["v2"]
    difference = np.subtract(auto, manual)
    assert summary["auto_minus_manual"]["mean"] == pytest.approx(difference.mean())
    assert summary["auto_minus_manual"]["std"] == pytest.approx(difference.std(ddof=1))
    assert summary["rounding_change"]["mean"] == pytest.approx(-0.01)
    assert summary["manual"]["n"] == 3


@pytest.mark.slow
def test_tiny_study_runs_and_resumes(tmp_path):
    _write_fashion(tmp_path / "data", num_train=64, num_test=32)
    settings = study.StudySettings(
        max_train_examples=64, epochs=2, batch_size=32, seeds=(0,), lambdas=(0.0, 5e-2),
        penalty=5e-2, harden_at_epoch=1, data_dir=str(tmp_path / "data"),
    )  # fmt: skip
    out = tmp_path / "study"
    results = study.study(settings, str(out))
    assert (results["train_images"], results["test_images"]) == (64, 32)
    assert len(results["runs"]) == len(study.specs(settings)) == 6
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
    assert len(partial["runs"]) == 5 and partial["runs_planned"] == 6
    assert "5 of 6 planned runs are finished" in (out / "report.md").read_text()
