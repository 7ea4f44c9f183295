"""experiments.runtime_processes: the timing of ONNX and OpenVINO files in a process and the
summary over processes (the full run needs torchvision's graph, written outside CI)."""

import json

import pytest
from helpers import tiny_v2

from experiments import runtime_processes
from keras_autoshuffle import export, folding

WRITERS = {
    "onnxruntime": (export.export_onnx, ".onnx"),
    "openvino": (runtime_processes.openvino_xml, ""),
    "litert": (export.export_litert, ".tflite"),
}


@pytest.mark.lab
@pytest.mark.parametrize("runtime", runtime_processes.RUNTIMES)
def test_each_file_is_timed_every_round(tmp_path, runtime):
    pytest.importorskip("ai_edge_litert" if runtime == "litert" else runtime)
    model = tiny_v2()
    write, suffix = WRITERS[runtime]
    files = {
        "manual": write(model, str(tmp_path / f"manual{suffix}")),
        "manual_folded": write(folding.fold_model(model), str(tmp_path / f"f{suffix}")),
    }
    if runtime == "litert":  # the ONNX control beside LiteRT runs in ONNX Runtime
        pytest.importorskip("onnxruntime")
        files[runtime_processes.CONTROL] = export.export_onnx(model, str(tmp_path / "c.onnx"))
    side = model.input_shape[1]
    samples = runtime_processes.time_sessions(
        files, threads=1, rounds=4, calls=2, seed=0, side=side, runtime=runtime, pause=0.01
    )
    assert {name: len(ms) for name, ms in samples.items()} == {name: 4 for name in files}
    assert all(ms > 0 for values in samples.values() for ms in values)


def test_litert_files_run_in_litert_and_onnx_files_beside_them_in_onnx_runtime():
    assert runtime_processes._engine("litert", "a/folded.tflite") == "litert"
    assert runtime_processes._engine("litert", "a/torchvision.onnx") == "onnxruntime"
    assert runtime_processes._engine("openvino", "a/torchvision.onnx") == "openvino"


def test_summary_is_the_mean_over_processes_with_a_t_interval():
    # Three processes: mean 1.0, standard deviation 0.1; t(0.975, 2 degrees) = 4.303.
    processes = [
        {"ratios": {f"{a}/{b}": value for a, b in runtime_processes.RATIOS}}
        for value in (0.9, 1.0, 1.1)
    ]
    mean, low, high, n = runtime_processes.summary(processes)["manual_folded/manual"]
    half = 4.303 * 0.1 / 3**0.5
    assert (mean, n) == (pytest.approx(1.0), 3)
    assert (low, high) == (pytest.approx(1.0 - half, abs=1e-3), pytest.approx(1.0 + half, abs=1e-3))


@pytest.mark.parametrize(
    "flag", ["--processes=1", "--threads=0", "--rounds=0", "--calls=0", "--pause=-1", "--side=0"]
)
def test_too_small_settings_are_argparse_errors_naming_them(flag, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--torchvision", "unused", flag])
    assert f"Received: {flag[2:]}" in capsys.readouterr().err


def test_a_missing_torchvision_folder_is_refused_before_anything_is_built(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--torchvision", str(tmp_path / "absent")])
    assert f"Received: torchvision='{tmp_path / 'absent'}'" in capsys.readouterr().err


def test_given_files_are_each_timed_against_the_first(tmp_path, capsys):
    # The paired comparison of two ways of writing a file: a fresh process per sample.
    pytest.importorskip("onnxruntime")
    model = tiny_v2()
    old = export.export_onnx(model, str(tmp_path / "old.onnx"))
    new = export.export_onnx(folding.fold_model(model), str(tmp_path / "new.onnx"))
    rows = tmp_path / "rows.json"
    argv = ["--files", f"old={old}", f"new={new}", "--processes", "2", "--rounds", "2"]
    side = str(model.input_shape[1])
    assert runtime_processes.main([*argv, "--calls", "1", "--side", side, "--json", str(rows)]) == 0
    written = json.loads(rows.read_text())
    assert [list(p["ratios"]) for p in written["processes"]] == [["new/old"], ["new/old"]]
    assert set(written["processes"][0]["median_ms"]) == {"old", "new"}
    assert written["summary"]["new/old"][3] == 2
    assert "new/old: " in capsys.readouterr().out


@pytest.mark.parametrize(
    "files, received",
    [
        (["a=absent.onnx", "b=absent.onnx"], "no such file. Received: 'a=absent.onnx'"),
        (["noequals", "b=x"], "Received: 'noequals'"),
        (["=x", "b=x"], "Received: '=x'"),
    ],
)
def test_bad_given_files_are_argparse_errors_naming_them(files, received, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--files", *files])
    assert received in capsys.readouterr().err


def test_given_files_need_two_distinct_names(tmp_path, capsys):
    path = tmp_path / "a.onnx"
    path.write_bytes(b"")
    for files, received in (
        ([f"a={path}"], "at least two files"),
        ([f"a={path}", f"a={path}"], f"Received: 'a={path}'"),
    ):
        with pytest.raises(SystemExit):
            runtime_processes.main(["--files", *files])
        assert received in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --files or --torchvision, not both
        runtime_processes.main(["--files", f"a={path}", f"b={path}", "--torchvision", "x"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_spinning_probe_times_every_condition(tmp_path):
    pytest.importorskip("onnxruntime")
    from experiments import ort_spinning

    path = export.export_onnx(tiny_v2(), str(tmp_path / "m.onnx"))
    medians = ort_spinning.probe(path, rounds=2, calls=2)
    assert len(medians) == 4 and all(ms > 0 for ms in medians.values())
    rows = tmp_path / "rows.json"
    assert ort_spinning.main([path, "--rounds", "1", "--calls", "1", "--json", str(rows)]) == 0
    assert set(json.loads(rows.read_text())["medians_ms"]) == set(medians)
    with pytest.raises(SystemExit):
        ort_spinning.main([path, "--calls", "0"])
    with pytest.raises(SystemExit):
        ort_spinning.main([str(tmp_path / "absent.onnx")])


def test_side_is_refused_with_torchvision_and_given_files_keep_their_ratios(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--torchvision", str(tmp_path), "--side", "128"])
    assert "Received: side=128" in capsys.readouterr().err
    # Files named as the package's are still each timed against the first with --files.
    names = ["manual", "manual_folded", "torchvision"]
    pairs = runtime_processes.ratios_of(dict.fromkeys(names), against_first=True)
    assert pairs == (("manual_folded", "manual"), ("torchvision", "manual"))
    assert runtime_processes.ratios_of(dict.fromkeys(names)) == runtime_processes.RATIOS
