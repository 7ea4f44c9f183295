"""`experiments/int8_accuracy.py`'s pairing of a variant's rows with the full-integer rows
(by seed, per runtime) and its refusal of rows measured with other settings."""

import json

import numpy as np
import pytest
from scipy import stats

from experiments import int8_accuracy


def _row(seed, runtime, agreement, drop):
    return {"seed": seed, "runtime": runtime, "top1_agreement": agreement, "accuracy_drop": drop}


def test_paired_differences_are_the_per_seed_differences_with_a_t_interval():
    rng = np.random.default_rng(0)
    base = [_row(s, "onnx", rng.uniform(0.97, 0.99), rng.uniform(-0.2, 0.2)) for s in range(5)]
    base.append(_row(9, "onnx", 0.5, 9.0))  # a seed the variant lacks: not paired
    variant = [
        _row(
            r["seed"],
            "onnx",
            r["top1_agreement"] + 0.003 * (1 + r["seed"]),
            r["accuracy_drop"] - 0.1,
        )
        for r in base[:5]
    ]
    result = int8_accuracy.paired_differences(variant, base)
    assert set(result) == {"onnx"} and result["onnx"]["seeds"] == 5
    differences = 0.003 * np.arange(1, 6)
    half = stats.t.ppf(0.975, 4) * differences.std(ddof=1) / np.sqrt(5)
    entry = result["onnx"]["top1_agreement"]
    np.testing.assert_allclose(entry["mean"], differences.mean())
    np.testing.assert_allclose(
        entry["ci95"], [differences.mean() - half, differences.mean() + half]
    )
    np.testing.assert_allclose(result["onnx"]["accuracy_drop"]["mean"], -0.1)


def test_rows_of_other_settings_are_refused(tmp_path):
    settings = {"model": "/m.keras", "calibration_images": 500, "test_images": 10000}
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"settings": settings, "rows": []}))
    int8_accuracy.check_settings(settings, str(tmp_path / "new.json"), str(base))
    with pytest.raises(SystemExit, match="measured with other settings"):
        int8_accuracy.check_settings(
            {**settings, "calibration_images": 2000}, str(tmp_path / "new.json"), str(base)
        )
    with pytest.raises(SystemExit, match="holds rows of other settings"):
        int8_accuracy.check_settings({**settings, "variant": "x"}, str(base), None)
    with pytest.raises(SystemExit, match="no such rows file"):
        int8_accuracy.check_settings(settings, str(tmp_path / "new.json"), str(tmp_path / "no"))
