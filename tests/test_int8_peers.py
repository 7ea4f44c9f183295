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
    peers = json.loads((ROOT / "docs" / "results" / "int8_peers_cpu.json").read_text())
    table = json.loads((ROOT / "docs" / "results" / "model_table_cpu.json").read_text())
    return peers, table


def test_every_committed_row_records_how_it_was_timed():
    peers, _ = _rows()
    assert all(row["method"] in int8_peers.METHODS for row in peers)


def test_the_page_marks_one_process_figures_that_differ_from_each_runtime_alone():
    peers, table = _rows()
    page = int8_peers.render(peers, table)
    # The second run, in one process: ONNX Runtime's int8 / float 1.32 [1.00, 1.68] and
    # OpenVINO's 0.55 [0.50, 0.59], against 0.92 and 0.69 with each runtime alone; LiteRT's
    # 0.93 [0.85, 1.04] holds 0.98.
    (second,) = [line for line in page.splitlines() if line.startswith("| 2 (")]
    assert "1.32 [1.00, 1.68] (distorted)" in second and "0.55 [0.50, 0.59] (distorted)" in second
    assert "0.93 [0.85, 1.04] |" in second
    assert "run 2's ONNX Runtime int8 / float against 0.92 alone" in page
    assert "not claims until re-measured" in page
    # A row timed alone is not marked, whatever its figures.
    alone = {**peers[1], "method": "alone"}
    assert "distorted" not in int8_peers.render([alone], table)
    assert "not claims" not in int8_peers.render([alone], table)


@pytest.mark.parametrize("flag", ["--processes=0", "--rounds=0", "--calls=0", "--calibration=0"])
def test_too_small_settings_are_argparse_errors_naming_them(flag, capsys):
    with pytest.raises(SystemExit):
        int8_peers.main(["measure", flag])
    assert f"Received: {flag[2:]}" in capsys.readouterr().err
