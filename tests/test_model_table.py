"""The README's model table and the guide's weights table are the ones
`experiments/model_table.py` renders from the weights registry and the measured rows."""

import json
import pathlib

import pytest

from experiments import model_table
from keras_autoshuffle.applications import CHECKPOINTS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_table_is_rendered_from_the_measured_rows():
    # Fails when the README's table is edited by hand or the rows change without a render.
    argv = ["render", "--json", str(ROOT / model_table.ROWS), "--readme", str(ROOT / "README.md")]
    assert model_table.main([*argv, "--check"]) == 0


def test_the_inference_pages_table_without_vnni_is_rendered_from_its_rows():
    # docs/inference.md's second table: the measure on a CPU without VNNI.
    rows = ROOT / "docs" / "results" / "model_table_cpu_no_vnni.json"
    page = str(ROOT / "docs" / "inference.md")
    assert model_table.main(["render", "--json", str(rows), "--readme", page, "--check"]) == 0


def test_guide_table_is_rendered_from_the_registry():
    # Fails when the guide's table is edited by hand or the registry changes without a render.
    guide = str(ROOT / model_table.GUIDE)
    argv = ["render", "--json", str(ROOT / model_table.ROWS), "--guide", guide, "--check"]
    assert model_table.main(argv) == 0
    table = model_table.render_weights()
    # One line per registry entry, by width.
    names = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert names == [CHECKPOINTS[width].name for width in sorted(CHECKPOINTS)]
    assert "| `shufflenet_v2_x1_0.imagenet` | `shufflenetv2_x1-5666bf0f80.pth` | 8.8 MiB " in table
    assert "| 2,278,604 | 145M | 69.362 / 88.316 | 256 / 224 | all 64 digits |" in table


def test_readme_lines_are_the_registry_entries():
    rows = json.loads((ROOT / model_table.ROWS).read_text())
    lines = model_table.render(rows).splitlines()[2:6]
    names = [line.split("`")[3] for line in lines]
    assert names == [CHECKPOINTS[width].name for width in sorted(CHECKPOINTS)]
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
    # The caption names the machine and versions; the run's date and note stay in the rows.
    assert "Some CPU, 2 cores (TensorFlow 2.21.0; the run's date and the machine's load" in table
    assert "2026-11-27" not in table and "busy" not in table
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


def _int8_cells(row, prefixes):
    """The int8 table's cells of `row`, computed here from its numbers."""
    cells = []
    for p in prefixes:
        cells += [f"{row[p + '_int8_ms']:.2f}", f"{row[p + '_int8_bytes'] / 1e6:.1f}"]
    return cells


def _interval(value, scale):
    low, high = value["ci95"]
    return f"{value['mean'] * scale:.2f}", f"[{low * scale:.2f}, {high * scale:.2f}]"


INT8_ROW = {
    "width": 1.0,
    "parameters": 2_278_604,
    "macs": 144_907_992,
    "litert_ms": 7.125,
    "litert_bytes": 9_100_000,
    "ort_ms": 5.5,
    "openvino_ms": 4.25,
    "litert_int8_ms": 3.375,
    "litert_int8_bytes": 2_612_345,
    "ort_int8_ms": 4.0625,
    "ort_int8_bytes": 2_498_765,
    "openvino_int8_ms": 2.4375,
    "openvino_int8_bytes": 3_456_789,
    "int8_calibration_images": 32,
    "threads": 2,
    "machine": "Some CPU, 2 cores",
    "date": "2026-11-27",
    "tensorflow": "2.21.0",
    "note": "busy",
}


def test_int8_table_from_the_rows(tmp_path):
    int8_keys = [k for k in INT8_ROW if "_int8_" in k or k == "int8_calibration_images"]
    plain_row = {k: v for k, v in INT8_ROW.items() if k not in int8_keys}
    plain = model_table.render([plain_row])
    both = model_table.render([INT8_ROW])
    # Without int8 keys, the float table and its line alone, as before; with them, the
    # int8 table right under the float one and a caption after the machine's line.
    assert "int8" not in plain
    table, line = plain.split("\n\n")
    float_table, int8_table, line_again, caption = both.split("\n\n")
    assert (float_table, line_again) == (table, line)
    lines = int8_table.splitlines()
    prefixes = ["litert", "ort", "openvino"]
    headers = ["LiteRT", "ONNX Runtime", "OpenVINO"]
    assert lines[0] == "| int8 model |" + "".join(f" {h} ms | {h} MB |" for h in headers)
    assert lines[1] == "|---|" + "---|---|" * 3
    # One line per registry entry, the measured width's numbers from its row.
    assert len(lines) == 2 + len(CHECKPOINTS)
    expected = "| `ShuffleNetV2(1.0)` | " + " | ".join(_int8_cells(INT8_ROW, prefixes)) + " |"
    assert expected in lines
    assert "| `ShuffleNetV2(0.5)` | " + " | ".join(["-"] * 6) + " |" in lines
    assert f"calibrated on {INT8_ROW['int8_calibration_images']} seeded random images" in caption
    # A runtime's columns only where every row holds its int8 numbers.
    entry = CHECKPOINTS[0.5]
    other = {**INT8_ROW, "width": 0.5, "parameters": entry.num_params, "macs": entry.macs}
    for key in ("ort_int8_ms", "openvino_int8_bytes"):
        del other[key]
    two = model_table.render([INT8_ROW, other]).split("\n\n")[1].splitlines()
    assert two[0] == "| int8 model | LiteRT ms | LiteRT MB |"
    assert "| `ShuffleNetV2(0.5)` | " + " | ".join(_int8_cells(other, ["litert"])) + " |" in two
    assert "| `ShuffleNetV2(1.0)` | " + " | ".join(_int8_cells(INT8_ROW, ["litert"])) + " |" in two
    # A runtime with its ms but not its bytes (or none with both): no int8 table.
    half = {k: v for k, v in INT8_ROW.items() if k not in int8_keys or k.endswith("_ms")}
    assert model_table.render([half]) == plain
    # --readme writes both tables between the markers; --check then passes.
    readme = tmp_path / "README.md"
    readme.write_text(f"{model_table.BEGIN}\nold\n{model_table.END}\n")
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([INT8_ROW]))
    argv = ["render", "--json", str(rows), "--readme", str(readme)]
    assert model_table.main(argv) == 0 and model_table.main([*argv, "--check"]) == 0
    assert readme.read_text() == f"{model_table.BEGIN}\n{both}\n{model_table.END}\n"


def test_int8_agreement_from_the_accuracy_rows(tmp_path):
    # The export's default files: int8_levers' base setting, each runtime's mean and t
    # interval over the seeds computed here with SciPy.
    from scipy import stats

    accuracy = json.loads((ROOT / model_table.ACCURACY).read_text())
    caption = model_table.render([INT8_ROW]).split("\n\n")[-1]
    for header, runtime in (
        ("LiteRT", "litert"),
        ("ONNX Runtime", "onnx"),
        ("OpenVINO", "openvino"),
    ):
        rows = [r for r in accuracy["rows"] if r["runtime"] == runtime and r["setting"] == "7bit"]
        assert len(rows) == 5
        cells = []
        for key, scale in (("top1_agreement", 100), ("accuracy_drop", 1)):
            values = [scale * r[key] for r in rows]
            mean = sum(values) / len(values)
            low, high = stats.t.interval(0.95, len(values) - 1, mean, stats.sem(values))
            cells.append(f"{mean:.2f}" + "%" * (scale == 100) + f" [{low:.2f}, {high:.2f}]")
        assert f"{header} {cells[0]}, {cells[1]}" in caption
        assert "over 5 calibration seeds" in caption
    assert f"of {accuracy['settings']['calibration_images']:,} training images" in caption
    assert f"on the {accuracy['settings']['test_images']:,} test images" in caption
    assert "not on ImageNet" in caption and "trained on Fashion-MNIST" in caption
    # Another file (--accuracy): its numbers, and only the runtimes it holds.
    other = {
        "settings": {"calibration_images": 100, "test_images": 2000},
        "summary": {
            "onnx": {
                "seeds": 3,
                "top1_agreement": {"mean": 0.9512, "ci95": [0.94, 0.9624]},
                "accuracy_drop": {"mean": -0.25, "ci95": [-0.5, 0.0]},
            }
        },
    }
    path = tmp_path / "accuracy.json"
    path.write_text(json.dumps(other))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([INT8_ROW]))
    readme = tmp_path / "README.md"
    readme.write_text(f"{model_table.BEGIN}\n{model_table.END}\n")
    argv = ["render", "--json", str(rows), "--readme", str(readme), "--accuracy", str(path)]
    assert model_table.main(argv) == 0
    caption = readme.read_text().split(f"\n{model_table.END}")[0].split("\n\n")[-1]
    assert caption == model_table.render([INT8_ROW], other).split("\n\n")[-1]
    agreement, agreement_ci = _interval(other["summary"]["onnx"]["top1_agreement"], 100)
    drop, drop_ci = _interval(other["summary"]["onnx"]["accuracy_drop"], 1)
    assert f"points: ONNX Runtime {agreement}% {agreement_ci}, {drop} {drop_ci} (" in caption
    assert "LiteRT 9" not in caption and "OpenVINO 9" not in caption
    assert "over 3 calibration seeds of 100 training images, on the 2,000 test images" in caption


def test_int8_keys_are_export_models():
    # measure reads each int8 file's path under export_model's result key.
    from keras_autoshuffle import export

    keys = {fmt: key for key, (fmt, _) in export.INT8_FILES.items()}
    assert model_table.INT8_KEYS == keys
    prefixes = [task.removesuffix("_infer") for task in model_table.TASKS.values()]
    assert prefixes == list(model_table.INT8_COLUMNS)


def test_bad_arguments():
    with pytest.raises(SystemExit):
        model_table.parse_args(["measure", "--threads", "0"])
    with pytest.raises(SystemExit):
        model_table.parse_args(["measure", "--processes", "0"])
    with pytest.raises(SystemExit):
        model_table.parse_args(["render", "--check"])  # --check needs --readme or --guide
    with pytest.raises(SystemExit, match="No checkpoint for width"):
        model_table.main(["measure", "--widths", "0.7", "--json", "unused.json"])


@pytest.mark.lab
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
    # Each float file's int8 file, timed in the same processes (the quantizers installed).
    int8 = [p for p in model_table.INT8_COLUMNS if f"{p}_int8_ms" in row]
    assert "litert" in int8 and row["int8_calibration_images"] == model_table.INT8_CALIBRATION
    for p in int8:
        assert row[f"{p}_int8_ms"] > 0 and 0 < row[f"{p}_int8_bytes"] < row["litert_bytes"]
    assert ("ort" in int8) == ("ort_ms" in row) and ("openvino" in int8) <= ("openvino_ms" in row)
    assert "| int8 model | LiteRT ms | LiteRT MB |" in model_table.render([row])
    assert "each runtime alone in 1 fresh process, " in model_table.render([row])
    assert row["parameters"] == CHECKPOINTS[0.5].num_params
    assert row["macs"] > 0 and row["litert_ms"] > 0 and row["litert_bytes"] > 4e6
