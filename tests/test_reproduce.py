"""Smoke test of scripts/reproduce.py's quick path with tiny settings."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_autoshuffle import data
from keras_autoshuffle.experiments import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quick_path_writes_report_json_and_pictures(tmp_path):
    out = tmp_path / "report"
    command = [
        sys.executable,
        os.path.join(ROOT, "scripts", "reproduce.py"),
        "--quick",
        "--output", str(out),
        "--epochs", "2",
        "--lambdas", "0", "0.05",
        "--harden-at-epoch", "1",
        "--max-train-examples", "128",
        "--jobs", "2",  # the process pool path (rows come back from worker processes)
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=900)

    for name in ("report.md", "results.json", "pmat.png", "smat.png", "penaltyplot.png",
                 "roundplot.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert [row["lambda"] for row in results["lambda_sweep"]] == [0.0, 0.05]
    for row in results["lambda_sweep"]:
        assert set(row) >= {"lambda", "relaxed_accuracy", "rounded_accuracy", "penalty"}
    assert {(r["model"], r["shuffle"]) for r in results["comparison"]} == {
        ("v1", "manual"), ("v1", "auto"), ("v2", "manual"), ("v2", "auto"),
    }  # fmt: skip
    report = (out / "report.md").read_text()
    for name in results["figures"].values():
        assert f"({name})" in report

    # The rounded accuracy in the JSON, recomputed from the saved hardened model with an
    # independent argmax over its predictions.
    _, test = data.digits(seed=0)
    images = np.concatenate([x.numpy() for x, _ in test.eval_dataset(100)])
    labels = np.concatenate([y.numpy() for _, y in test.eval_dataset(100)])
    for row in results["lambda_sweep"] + results["comparison"]:
        model = keras.saving.load_model(row["model_path"], safe_mode=True)
        accuracy = float(np.mean(np.argmax(model.predict(images, verbose=0), -1) == labels))
        assert accuracy == pytest.approx(row["rounded_accuracy"], abs=1e-6)
        assert not any(getattr(layer, "is_hardened", True) is False for layer in model.layers), (
            "the saved model must be hardened"
        )


def test_settings_are_validated():
    with pytest.raises(ValueError, match="Received: jobs=0"):
        reproduce.reproduce(reproduce.quick(), "unused", jobs=0)
    with pytest.raises(ValueError, match="Received: lambdas"):
        reproduce.Settings(lambdas=(0.0, 1e-3))  # the default penalty 5e-2 is missing
    with pytest.raises(ValueError, match="Received: harden_at_epoch=10"):
        reproduce.Settings(harden_at_epoch=10)
