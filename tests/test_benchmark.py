"""`python -m experiments.benchmark --quick` runs end to end and writes well-formed JSON rows."""

import importlib.util
import json
import time

import keras
import numpy as np
import pytest
from helpers import tiny_v1

from experiments import benchmark, timing
from keras_autoshuffle import folding


@pytest.mark.lab
@pytest.mark.slow
def test_quick_benchmark_writes_rows(tmp_path, capsys, monkeypatch):
    # The quick run on a tiny v1 g3 (tests/helpers.py) instead of the 0.25x net: the same
    # tasks, variants, rows and table, with a third of the LiteRT converter's time (most
    # of the run). The quick nets themselves are built below, in the time-out test.
    monkeypatch.setattr(
        benchmark, "model_specs", lambda quick: {"v1_tiny": (tiny_v1, {"groups": 3})}
    )
    path = tmp_path / "rows.json"
    variants = ["manual", "balanced_folded"]  # the others share the code paths (time budget)
    argv = ["--quick", "--models", "v1", "--variants", *variants, "--json", str(path)]
    assert benchmark.main(argv) == 0
    rows = json.loads(path.read_text())
    keys = {"task", "model", "variant", "input", "batch", "median_ms", "rounds_ms"}
    assert rows and all(set(row) == keys for row in rows)
    assert all(row["median_ms"] > 0 for row in rows)
    # The median is the rounds' (2 with --quick), and the rounds are kept for paired ratios.
    assert all(row["median_ms"] == pytest.approx(np.median(row["rounds_ms"])) for row in rows)
    assert {len(row["rounds_ms"]) for row in rows} == {2}
    tasks = {(row["task"], row["batch"]): set() for row in rows}
    for row in rows:
        tasks[row["task"], row["batch"]].add(row["variant"])
    assert tasks["train_step", 8] == {"manual", "relaxed"}
    assert tasks["keras_infer", 1] == set(variants)
    assert tasks["litert_infer", 1] == set(variants)
    table = capsys.readouterr().out
    assert "| litert_infer | v1_tiny | 32 | 1 | balanced_folded |" in table
    manual = next(r for r in rows if r["task"] == "litert_infer" and r["variant"] == "manual")
    assert f"| {manual['median_ms']:.2f} | 1.000 |" in table


def test_bad_arguments():
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--repeats", "0"])
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--tasks", "fly"])


@pytest.mark.parametrize(
    "model_name", ["v1_g3_0.25", pytest.param("v2_0.5", marks=pytest.mark.slow)]
)
def test_balanced_variant_survives_a_forced_time_out(monkeypatch, model_name):
    # A time limit far below what the balanced solver needs: hardening must return the
    # best balanced permutation found so far (not raise), and the benchmark go on.
    reports = []
    harden_model = benchmark.harden_model

    def recording(model, **kwargs):
        reports.append(harden_model(model, **kwargs))
        return reports[-1]

    monkeypatch.setattr(benchmark, "harden_model", recording)
    spec = benchmark.model_specs(quick=True)[model_name]
    models = benchmark.build_variants(model_name, spec, 32, 10, ["balanced_folded"], 1e-3)
    folded = models["balanced_folded"]
    assert folding.count_gathers(folded) == 0  # every shuffle balanced, then folded
    (report,) = reports
    balanced = [entry for entry in report if "groups" in entry]
    assert balanced and all(isinstance(entry["optimal"], bool) for entry in balanced)
    outputs = keras.ops.convert_to_numpy(folded(np.zeros((1, 32, 32, 3)), training=False))
    assert outputs.shape == (1, 10) and np.all(np.isfinite(outputs))


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "openvino")),
    reason="needs the onnx and openvino extras",
)
def test_runtime_tasks_time_onnx_runtime_and_openvino(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        benchmark, "model_specs", lambda quick: {"v1_tiny": (tiny_v1, {"groups": 3})}
    )
    path = tmp_path / "rows.json"
    argv = ["--quick", "--models", "v1", "--variants", "manual", "manual_folded"]
    argv += ["--tasks", "ort_infer", "openvino_infer", "--json", str(path)]
    assert benchmark.main(argv) == 0
    rows = json.loads(path.read_text())
    assert {(r["task"], r["variant"]) for r in rows} == {
        (t, v) for t in ("ort_infer", "openvino_infer") for v in ("manual", "manual_folded")
    }
    assert "| ort_infer | " in capsys.readouterr().out


def test_runtime_table_gives_ratios_to_torchvision_in_onnx_runtime():
    rows = [
        {"task": t, "model": "v2_1.0", "variant": v, "input": 224, "batch": 1, "median_ms": ms}
        for t, v, ms in [
            ("ort_infer", "torchvision", 4.0),
            ("ort_infer", "manual_folded", 3.0),
            ("openvino_infer", "torchvision", 2.0),
            ("litert_infer", "manual_folded", 1.0),
        ]
    ]
    table = benchmark.runtime_table(rows)
    assert "| runtime | torchvision | manual_folded |" in table
    assert "| ort_infer | 4.00 (1.00) | 3.00 (0.75) |" in table
    assert "| openvino_infer | 2.00 (0.50) | - |" in table
    assert "| litert_infer | - | 1.00 (0.25) |" in table


def test_runtime_ratios_pair_the_rounds_timed_together():
    # Round 3 ran under load for torchvision's graph only: per round the folded net takes
    # 1.1x torchvision's time (its median, 5.0 ms, over torchvision's would say 0.5x).
    rounds = {"torchvision": [1.0, 10.0, 10.0], "manual": [1.0, 10.0, 10.0]}
    rounds["manual_folded"] = [1.1, 11.0, 5.0]
    rows = [
        {
            "task": "ort_infer",
            "model": "v2_1.0",
            "variant": v,
            "input": 224,
            "batch": 1,
            "median_ms": float(np.median(ms)),
            "rounds_ms": ms,
        }
        for v, ms in rounds.items()
    ]
    table = benchmark.runtime_table(rows)
    assert "| ort_infer | 10.00 (1.00, 1.00-1.00) | 10.00 (1.00, 1.00-1.00) | 5.00 (1.10, " in table
    assert "manual_folded / manual: ort_infer 1.10, 0.50-1.10" in table


def test_paired_ratio_interval_brackets_the_median_of_the_round_ratios():
    rng = np.random.default_rng(3)
    reference = rng.uniform(4, 8, 40)
    samples = reference * rng.normal(0.9, 0.05, 40)
    median, low, high = benchmark.paired_ratio(samples, reference)
    assert median == pytest.approx(np.median(samples / reference))
    assert 0.8 < low < median < high < 1.0
    assert benchmark.paired_ratio(samples[:-1], reference) is None


def test_measure_times_each_function_every_round_in_a_new_order():
    calls = []
    functions = {name: (lambda n=name: calls.append(n)) for name in "abcd"}
    samples = benchmark.measure(functions, repeats=12, min_seconds=0)
    assert {name: len(ms) for name, ms in samples.items()} == dict.fromkeys("abcd", 12)
    timed = calls[2 * len(functions) :]  # after the warm-up and the one-call timing
    rounds = [tuple(timed[i : i + 4]) for i in range(0, len(timed), 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    # No function always follows the same one (rotating a fixed order would keep that).
    before = {r[r.index("b") - 1] for r in rounds if r.index("b")}
    assert len(before) > 1


def test_the_pause_before_each_block_is_idle_time_not_timed():
    # 20 ms idle before each block of one instant call: timed, it would read >= 20 ms.
    start = time.perf_counter()
    samples = timing.measure({"a": lambda: None, "b": lambda: None}, 3, number=1, pause=0.02)
    assert time.perf_counter() - start >= 6 * 0.02
    assert max(max(ms) for ms in samples.values()) < 10


def test_warmup_calls_of_the_same_function_precede_each_block_untimed():
    # 3 untimed calls of a function right before each block of 2 timed calls of it; every
    # call sleeps 5 ms: timed with its warm-up, a block would read 12.5 ms a call.
    calls = []

    def call(name):
        calls.append(name)
        time.sleep(0.005)

    functions = {name: (lambda n=name: call(n)) for name in "ab"}
    samples = timing.measure(functions, 4, number=2, warmup=3)
    timed = calls[2 * 2 :]  # after each function's warm-up and one-call timing
    blocks = [timed[i : i + 5] for i in range(0, len(timed), 5)]
    assert len(blocks) == 8 and all(len(set(block)) == 1 for block in blocks)
    assert 5 <= min(min(ms) for ms in samples.values())
    assert max(max(ms) for ms in samples.values()) < 10
