"""`experiments/folded_files.py`: its slices file keeps the slices `export.export_litert`
no longer writes, so the two float files it times differ."""

import pytest
from helpers import tiny_v2

from experiments import folded_files
from keras_autoshuffle import export, folding

# Two LiteRT conversions: 14 s of CPU, the last file of the run without the mark (conftest.py).
pytestmark = [pytest.mark.tensorflow_only, pytest.mark.slow]


@pytest.mark.lab
def test_the_slices_file_is_not_the_one_conv_per_slice_file(tmp_path):
    pytest.importorskip("ai_edge_litert")
    net = folding.fold_model(tiny_v2(classes=3))
    slices = folded_files.litert_ops(folded_files.export_slices(net, tmp_path / "s.tflite"))
    convs = folded_files.litert_ops(export.export_litert(net, tmp_path / "c.tflite"))
    assert slices.get("STRIDED_SLICE", 0) + slices.get("SPLIT", 0) > 0
    assert "STRIDED_SLICE" not in convs and "SPLIT" not in convs
    assert convs["CONV_2D"] > slices["CONV_2D"]
