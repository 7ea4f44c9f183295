"""experiments/int8_peers.py: each runtime timed alone in fresh processes (issue 53, item 3),
and the page of its rows naming how each row was timed. No timing is asserted: the full run
needs torch and torchvision (another venv, outside CI)."""

import json
import os
import pathlib

import pytest
from helpers import tiny_v2

from experiments import int8_peers, runtime_processes
from keras_autoshuffle import export

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The module each runtime's child imports (runtime_processes.RUNTIME_MODULES' names); LiteRT
# is left out here: its tiny file takes the converter some 10-20 s to write.
MODULES = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


@pytest.mark.slow
def test_each_runtime_is_timed_in_its_own_fresh_process_per_repeat(tmp_path):
    for module in MODULES.values():
        pytest.importorskip(module)
    # One tiny float file per runtime under both of our peers' names (what is timed does
    # not matter here, only where).
    model = tiny_v2()
    writers = {
        "ort": (export.export_onnx, ".onnx"),
        "ov": (runtime_processes.openvino_xml, ""),
    }
    files = {}
    for prefix, (write, suffix) in writers.items():
        path = write(model, str(tmp_path / f"{prefix}{suffix}"))
        files.update({f"{prefix}_our_fp32": path, f"{prefix}_our_int8": path})
    rows = int8_peers.time_alone(files, processes=1, rounds=1, calls=1, side=16, threads=1)
    # One process per runtime and repeat, none of them this one, each with its runtime only.
    assert sorted(row["runtime"] for row in rows) == sorted(MODULES)
    assert len({row["pid"] for row in rows}) == 2 and os.getpid() not in {r["pid"] for r in rows}
    assert all(row["loaded"] == [MODULES[row["runtime"]]] for row in rows), rows
    assert all(set(row["times_ms"]) == {"ours_fp32", "ours_int8"} for row in rows)
    ratios = {(r["a"], r["b"]): r for r in int8_peers.peer_ratios(rows)}
    for prefix in writers:
        entry = ratios[f"{prefix}_our_int8", f"{prefix}_our_fp32"]
        assert entry["processes"] == 1 and entry["paired"] == "round" and entry["low"] is None
    assert ratios["ort_our_int8", "ort_tv_int8"]["missing"]  # no torchvision file given


def test_children_name_torchvisions_files_for_nchw_input_and_back():
    for peer in ("ort_tv_int8", "ov_tv_int8", "torch_tv_int8", "litert_our_fp32"):
        runtime = int8_peers.RUNTIMES[peer.split("_")[0]]
        child = int8_peers.child_name(peer)
        assert child.startswith(runtime_processes.NCHW_PREFIX) == ("_tv_" in peer)
        assert int8_peers.peer_name(runtime, child) == peer
    assert runtime_processes._engine("torch", "peers/tv_int8_torch.pt") == "torch"


def _rows():
    return json.loads((ROOT / "docs" / "results" / "int8_peers_cpu.json").read_text())


def test_every_committed_row_records_how_it_was_timed():
    assert all(row["method"] in int8_peers.METHODS for row in _rows())


def _alone(row, ratios, flags):
    """A row timed alone on a CPU with `flags`, of batch-1 `ratios` {(a, b): value}."""
    entries = [
        {"batch": 1, "a": a, "b": b, "ratio": v, "low": v - 0.01, "high": v + 0.01}
        for (a, b), v in ratios.items()
    ]
    return {**row, "method": "alone", "cpu": {**row["cpu"], "flags": flags}, "ratios": entries}


def test_one_process_figures_are_checked_against_a_run_alone_on_the_same_cpu():
    # The second committed run, in one process on an AMD EPYC without AVX-512: ONNX
    # Runtime's int8 / float 1.32 [1.00, 1.68], OpenVINO's 0.55 [0.50, 0.59], LiteRT's
    # 0.93 [0.85, 1.04].
    second = _rows()[1]
    assert second["method"] == "one_process" and second["cpu"]["flags"] == []
    ratios = {
        ("ort_our_int8", "ort_our_fp32"): 0.92,
        ("ov_our_int8", "ov_our_fp32"): 0.69,
        ("litert_our_int8", "litert_our_fp32"): 0.98,
    }
    page = int8_peers.render([second, _alone(second, ratios, [])])
    (first,) = [line for line in page.splitlines() if line.startswith("| 1 (")]
    assert "| AMD EPYC (no AVX-512) |" in first
    assert "1.32 [1.00, 1.68] (distorted)" in first and "0.55 [0.50, 0.59] (distorted)" in first
    assert "0.93 [0.85, 1.04] |" in first
    assert "run 1's ort_our_int8 / ort_our_fp32 against 0.92 in run 2" in page
    assert "not claims" not in page
    # Timed alone on another CPU (AVX-512): nothing to check the first run against.
    page = int8_peers.render([second, _alone(second, ratios, ["avx512f"])])
    assert "distorted" not in page.split("\n\n")[1]
    assert "Runs 1: no run timed alone on their CPU, so not claims." in page
    # A row timed alone is not marked, whatever its figures.
    assert "distorted" not in int8_peers.render([_alone(second, ratios, [])])


@pytest.mark.parametrize("flag", ["--processes=0", "--rounds=0", "--calls=0", "--calibration=0"])
def test_too_small_settings_are_argparse_errors_naming_them(flag, capsys):
    with pytest.raises(SystemExit):
        int8_peers.main(["measure", flag])
    assert f"Received: {flag[2:]}" in capsys.readouterr().err
