"""experiments.runtime_processes: the timing of ONNX and OpenVINO files in a process and the
summary over processes (the full run needs torchvision's graph, written outside CI)."""

import pytest
from helpers import tiny_v2

from experiments import runtime_processes
from keras_autoshuffle import export, folding

WRITERS = {
    "onnxruntime": (export.export_onnx, ".onnx"),
    "openvino": (runtime_processes.openvino_xml, ""),
    "litert": (export.export_litert, ".tflite"),
}


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
    "flag", ["--processes=1", "--threads=0", "--rounds=0", "--calls=0", "--pause=-1"]
)
def test_too_small_settings_are_argparse_errors_naming_them(flag, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--torchvision", "unused", flag])
    assert f"Received: {flag[2:]}" in capsys.readouterr().err


def test_a_missing_torchvision_folder_is_refused_before_anything_is_built(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runtime_processes.main(["--torchvision", str(tmp_path / "absent")])
    assert f"Received: torchvision='{tmp_path / 'absent'}'" in capsys.readouterr().err
