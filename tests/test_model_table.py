"""The README's model table and the guide's weights table are the ones
`experiments/model_table.py` renders from the weights registry and the measured rows."""

import json
import pathlib

import pytest

from experiments import model_table
from keras_autoshuffle import applications
from keras_autoshuffle.applications import CHECKPOINTS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_table_is_rendered_from_the_measured_rows():
    # Fails when the README's table is edited by hand or the rows change without a render.
    argv = ["render", "--json", str(ROOT / model_table.ROWS), "--readme", str(ROOT / "README.md")]
    assert model_table.main([*argv, "--check"]) == 0


def test_guide_table_is_rendered_from_the_registry():
    # Fails when the guide's table is edited by hand or the registry changes without a render.
    guide = str(ROOT / model_table.GUIDE)
    argv = ["render", "--json", str(ROOT / model_table.ROWS), "--guide", guide, "--check"]
    assert model_table.main(argv) == 0
    table = model_table.render_weights()
    # One line per registry entry, in list_weights() order.
    names = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert names == applications.list_weights()
    assert "| `shufflenet_v2_x1_0.imagenet` | `shufflenetv2_x1-5666bf0f80.pth` | 8.8 MiB " in table
    assert "| 2,278,604 | 145M | 69.362 / 88.316 | 256 / 224 | all 64 digits |" in table


def test_readme_lines_are_the_registry_entries():
    rows = json.loads((ROOT / model_table.ROWS).read_text())
    lines = model_table.render(rows).splitlines()[2:6]
    names = [line.split("`")[3] for line in lines]
    assert names == applications.list_weights()
    # A row whose counts differ from its entry's is refused (one number per claim).
    wrong = [{**rows[0], "parameters": rows[0]["parameters"] + 1}]
    with pytest.raises(ValueError, match="the registry's shufflenet_v2_x0_5.imagenet holds"):
        model_table.render(wrong)


def test_every_pretrained_width_has_a_measured_row():
    rows = json.loads((ROOT / model_table.ROWS).read_text())
    assert sorted(row["width"] for row in rows) == sorted(CHECKPOINTS)
    for row in rows:
        # The builder's count is torchvision's (the registry holds torchvision's number).
        assert row["parameters"] == CHECKPOINTS[row["width"]].num_params
        assert row["input"] == 224 and row["batch"] == 1 and row["threads"] == 2
        assert row["litert_ms"] > 0 and row["litert_bytes"] > 4 * row["parameters"] * 0.9


def test_render_and_replace(tmp_path):
    row = {
        "width": 1.0,
        "parameters": 2_278_604,
        "macs": 144_907_992,
        "litert_ms": 7.125,
        "litert_bytes": 9_100_000,
        "threads": 2,
        "machine": "Some CPU, 2 cores",
        "date": "2026-11-27",
        "tensorflow": "2.21.0",
        "note": "busy",
    }
    table = model_table.render([row])
    line = "| `ShuffleNetV2(1.0)` | `shufflenet_v2_x1_0.imagenet` | 2.28M | 145M | 69.4 / 88.3 "
    assert line + "| 7.12 | 9.1 |" in table
    # An entry without a measured row keeps its registry numbers, its times unmeasured.
    assert "| `shufflenet_v2_x0_5.imagenet` | 1.37M | 40M | 60.6 / 81.7 | - | - |" in table
    assert "Some CPU, 2 cores (TensorFlow 2.21.0, 2026-11-27); busy." in table
    both = model_table.render([{**row, "ort_ms": 5.5, "openvino_ms": 4.25}])
    assert "| LiteRT MB | ONNX Runtime ms | OpenVINO ms |" in both
    assert "| 7.12 | 9.1 | 5.50 | 4.25 |" in both
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{model_table.BEGIN}\nold\n{model_table.END}\nafter\n")
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([row]))
    argv = ["render", "--json", str(rows), "--readme", str(readme)]
    assert model_table.main([*argv, "--check"]) == 1  # "old" is not the rendered table
    assert model_table.main(argv) == 0
    assert readme.read_text() == f"intro\n{model_table.BEGIN}\n{table}\n{model_table.END}\nafter\n"
    assert model_table.main([*argv, "--check"]) == 0
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="model-table markers"):
        model_table.main(argv)
    guide = tmp_path / "guide.md"
    guide.write_text(f"a\n{model_table.WEIGHTS_BEGIN}\nold\n{model_table.WEIGHTS_END}\nb\n")
    argv = ["render", "--json", str(rows), "--guide", str(guide)]
    assert model_table.main([*argv, "--check"]) == 1
    assert model_table.main(argv) == 0 and model_table.main([*argv, "--check"]) == 0
    table = model_table.render_weights()
    expected = f"a\n{model_table.WEIGHTS_BEGIN}\n{table}\n{model_table.WEIGHTS_END}\nb\n"
    assert guide.read_text() == expected


def test_bad_arguments():
    with pytest.raises(SystemExit):
        model_table.parse_args(["measure", "--threads", "0"])
    with pytest.raises(SystemExit):
        model_table.parse_args(["measure", "--processes", "0"])
    with pytest.raises(SystemExit):
        model_table.parse_args(["render", "--check"])  # --check needs --readme or --guide
    with pytest.raises(SystemExit, match="No checkpoint for width"):
        model_table.main(["measure", "--widths", "0.7", "--json", "unused.json"])


@pytest.mark.slow
def test_measure_writes_a_row(tmp_path, monkeypatch):
    # The same path as the README's rows at 32x32 instead of 224x224 (a tenth of the time).
    monkeypatch.setattr(model_table, "SIDE", 32)
    path = tmp_path / "rows.json"
    argv = ["measure", "--widths", "0.5", "--repeats", "2", "--json", str(path), "--note", "x"]
    assert model_table.main([*argv, "--processes", "1"]) == 0
    (row,) = json.loads(path.read_text())
    assert row["width"] == 0.5 and row["input"] == 32 and row["note"] == "x"
    # Timed in a fresh process per runtime (runtime_processes' child).
    assert row["processes_per_runtime"] == 1
    assert all(row[key] > 0 for key in ("litert_ms", *model_table.COLUMNS) if key in row)
    assert "each runtime alone in 1 fresh process, " in model_table.render([row])
    assert row["parameters"] == CHECKPOINTS[0.5].num_params
    assert row["macs"] > 0 and row["litert_ms"] > 0 and row["litert_bytes"] > 4e6
