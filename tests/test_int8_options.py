"""The int8 writers' accuracy options (issue 53, item 2): the weights' bits and the
calibration method, on a tiny untrained net (the files' contents, not their accuracy)."""

import os
import re

import numpy as np
import pytest
from helpers import TINY_SHAPE, needs_extra, tiny_v2

from keras_autoshuffle import export, folding
from keras_autoshuffle.export import int8_runtimes, onnx_runtimes

pytestmark = needs_extra("onnx")


@pytest.fixture(scope="module")
def float_files(tmp_path_factory):
    """The float ONNX file (and OpenVINO IR where installed) of a tiny folded net, and
    calibration images."""
    images = np.random.default_rng(0).normal(size=(32, *TINY_SHAPE)).astype("float32")
    formats = ("onnx",) + (() if export.unsupported_formats(("openvino",)) else ("openvino",))
    model = folding.fold_model(tiny_v2(classes=10))
    results = export.export_model(model, str(tmp_path_factory.mktemp("float")), images[:2], formats)
    return {fmt: results[fmt]["path"] for fmt in formats}, images


def _onnx_weights(path):
    """The int8 weights of each quantized Conv of an ONNX file."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    quantized = {
        n.output[0]: constants[n.input[0]]
        for n in graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in constants
    }
    return [quantized[n.input[1]] for n in graph.node if n.op_type == "Conv"]


def test_onnx_weights_use_8_bits_only_when_asked(float_files, tmp_path):
    # 7 bits (ONNX Runtime's reduce_range, the default): every weight within [-64, 64];
    # 8 bits: each channel's largest weight at +-127.
    paths, images = float_files
    seven = int8_runtimes.export_onnx_int8(paths["onnx"], str(tmp_path / "7.onnx"), images)
    eight = int8_runtimes.export_onnx_int8(
        paths["onnx"], str(tmp_path / "8.onnx"), images, weight_bits=8
    )
    assert max(int(np.abs(w.astype(int)).max()) for w in _onnx_weights(seven)) <= 64
    assert max(int(np.abs(w.astype(int)).max()) for w in _onnx_weights(eight)) == 127


def _input_scale(path):
    """The scale of the ONNX file's first QuantizeLinear (its input's)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    first = next(n for n in graph.node if n.op_type == "QuantizeLinear")
    return float(constants[first.input[1]])


def test_percentile_calibration_clips_the_onnx_ranges(float_files, tmp_path):
    # One outlier among 200 x 768 input values (under 0.001% of them): min/max follows it,
    # the 99.999th percentile of |x| does not.
    paths, _ = float_files
    images = np.random.default_rng(1).normal(size=(200, *TINY_SHAPE)).astype("float32")
    images[0, 0, 0, 0] = 50.0
    minmax = int8_runtimes.export_onnx_int8(paths["onnx"], str(tmp_path / "m.onnx"), images)
    percentile = int8_runtimes.export_onnx_int8(
        paths["onnx"], str(tmp_path / "p.onnx"), images, calibration_method="percentile"
    )
    assert _input_scale(percentile) < 0.5 * _input_scale(minmax)


def test_each_concatenation_takes_its_inputs_at_its_outputs_scale(float_files, tmp_path):
    # ONNX Runtime's int8 Concat copies only where every input's scale and zero point are
    # its output's; calibrated apart it requantizes each input (1.48x the float Concat's
    # time on ShuffleNet v2 1.0x). The tiny folded net has concatenations of both kinds:
    # a branch's conv output and a slice of the unit's input.
    import onnx
    from onnx import numpy_helper

    paths, images = float_files
    graph = onnx.load(
        int8_runtimes.export_onnx_int8(paths["onnx"], str(tmp_path / "int8.onnx"), images)
    ).graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    made_by = {out: n for n in graph.node for out in n.output}
    read_by = {name: n for n in graph.node for name in n.input}

    def parameters(node):  # (scale, zero point) of a QuantizeLinear or DequantizeLinear
        return tuple(float(constants[name]) for name in node.input[1:3])

    concats = [n for n in graph.node if n.op_type == "Concat"]
    assert concats
    for concat in concats:
        output = parameters(read_by[concat.output[0]])
        inputs = [parameters(made_by[name]) for name in concat.input]
        assert all(p == output for p in inputs), (concat.name, inputs, output)


@pytest.mark.slow
@needs_extra("openvino")
def test_openvino_weights_use_8_bits_only_when_asked(float_files, tmp_path):
    # NNCF's int8 weight constants of the dense layers (4-D convolutions and the
    # classifier): within [-64, 64] with 7 bits. Its overflow fix leaves the depthwise
    # (5-D, grouped) weights at 8 bits: their kernels do not add pairs of products.
    pytest.importorskip("nncf")
    import openvino

    paths, images = float_files

    def largest_weight(folder):
        model = openvino.Core().read_model(os.path.join(folder, onnx_runtimes.OPENVINO_XML))
        return max(
            int(np.abs(op.get_data().astype(int)).max())
            for op in model.get_ordered_ops()
            if op.get_type_name() == "Constant"
            and op.get_element_type() == openvino.Type.i8
            and len(op.get_output_shape(0)) < 5
        )

    seven = int8_runtimes.export_openvino_int8(paths["openvino"], str(tmp_path / "7"), images)
    eight = int8_runtimes.export_openvino_int8(
        paths["openvino"], str(tmp_path / "8"), images, weight_bits=8
    )
    assert largest_weight(seven) <= 64 and largest_weight(eight) == 127


@needs_extra("openvino")
def test_openvino_ranges_span_every_calibration_image(float_files, tmp_path):
    # One pixel of one image at 50 among values of about +-4: "minmax" ranges, as ONNX
    # Runtime's and LiteRT's, reach it; NNCF's own default (the mean of each image's
    # range) clipped it at 3.6.
    pytest.importorskip("nncf")
    import openvino

    paths, _ = float_files
    images = np.random.default_rng(1).normal(size=(200, *TINY_SHAPE)).astype("float32")
    images[0, 0, 0, 0] = 50.0

    def input_high(folder):
        model = openvino.Core().read_model(os.path.join(folder, onnx_runtimes.OPENVINO_XML))
        first = model.get_parameters()[0].output(0).get_target_inputs()
        (fake_quantize,) = [t.get_node() for t in first]
        assert fake_quantize.get_type_name() == "FakeQuantize"
        return float(np.max(fake_quantize.input_value(2).get_node().get_data()))

    minmax = int8_runtimes.export_openvino_int8(paths["openvino"], str(tmp_path / "m"), images)
    assert input_high(minmax) >= 49.0


@pytest.mark.parametrize(
    "option",
    [
        {"weight_bits": 6},
        {"weight_bits": True},
        {"weight_bits": "8"},
        {"calibration_method": "entropy"},
        {"calibration_method": None},
    ],
)
def test_bad_options_are_refused_before_writing(float_files, tmp_path, option):
    paths, images = float_files
    ((name, value),) = option.items()
    target = tmp_path / "x.onnx"
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}={value!r}$"):
        int8_runtimes.export_onnx_int8(paths["onnx"], str(target), images, **option)
    assert not target.exists()


def test_percentile_calibration_on_constant_activations_says_so(float_files, tmp_path):
    # ONNX Runtime's Percentile histograms each activation: one constant to float32's
    # precision (here the input itself: 1, and once the next float32 after 1) failed with
    # numpy's "Too many bins for data range".
    paths, images = float_files
    flat = np.ones_like(images)
    flat[0, 0, 0, 0] = np.nextafter(np.float32(1), np.float32(2))
    target = tmp_path / "x.onnx"
    with pytest.raises(ValueError, match=r"activation is constant.*'minmax'.*percentile'$"):
        int8_runtimes.export_onnx_int8(
            paths["onnx"], str(target), flat, calibration_method="percentile"
        )
    assert not target.exists()


def test_vnni_is_read_from_the_cpu_flags():
    with open("/proc/cpuinfo") as f:
        flags = set(f.read().split())
    assert int8_runtimes.cpu_has_vnni() == bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


@pytest.mark.parametrize("option", [{"int8_weight_bits": 16}, {"int8_weight_bits": 7.5}])
def test_export_model_refuses_bad_options_before_writing(tmp_path, option):
    images = np.random.default_rng(0).normal(size=(16, *TINY_SHAPE)).astype("float32")
    ((name, value),) = option.items()
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}={value!r}$"):
        export.export_model(
            folding.fold_model(tiny_v2(classes=10)),
            str(tmp_path / "out"),
            images[:2],
            formats=("onnx",),
            quantize="int8",
            representative_data=images,
            test_data=(images, np.arange(16) % 10),
            **option,
        )
    assert not (tmp_path / "out").exists()


def test_export_model_writes_8_bit_weights_when_asked(tmp_path):
    images = np.random.default_rng(0).normal(size=(16, *TINY_SHAPE)).astype("float32")
    results = export.export_model(
        folding.fold_model(tiny_v2(classes=10)),
        str(tmp_path / "out"),
        images[:2],
        formats=("onnx",),
        quantize="int8",
        representative_data=images,
        test_data=(images, np.arange(16) % 10),
        max_accuracy_drop=100.0,
        int8_weight_bits=8,
    )
    weights = _onnx_weights(results["onnx_int8"]["path"])
    assert max(int(np.abs(w.astype(int)).max()) for w in weights) == 127


def test_a_training_runs_export_writes_8_bit_weights_when_asked(tmp_path):
    # `train()` and `finetune()` export through `training.exports.export_run`: its
    # `int8_weight_bits` reaches the ONNX writer (the accuracy bound at 100: an untrained net).
    from keras_autoshuffle.training import exports

    images = np.random.default_rng(0).normal(size=(16, *TINY_SHAPE)).astype("float32")
    test = (images, np.arange(16) % 10)
    results = exports.export_run(
        tiny_v2(classes=10),
        str(tmp_path),
        images[:2],
        ("onnx",),
        (images, test),
        max_accuracy_drop=100.0,
        int8_weight_bits=8,
    )
    weights = _onnx_weights(results["onnx_int8"]["path"])
    assert max(int(np.abs(w.astype(int)).max()) for w in weights) == 127


def test_an_onnx_int8_path_without_its_suffix_is_refused_before_writing(float_files, tmp_path):
    # The int8 check reads the file back by its suffix: without .onnx the checked export
    # failed after quantizing, naming its temporary file; `export_onnx_int8` wrote a file
    # that `open_runner` refuses.
    paths, images = float_files
    target = str(tmp_path / "int8")
    test = (images[:4], np.zeros(4, "int64"))
    writers = {
        "export_int8_file_checked": lambda: int8_runtimes.export_int8_file_checked(
            "onnx_int8", paths["onnx"], target, images, test, np.eye(10)[:4], 100.0
        ),
        "export_onnx_int8": lambda: int8_runtimes.export_onnx_int8(paths["onnx"], target, images),
    }
    for name, write in writers.items():
        with pytest.raises(
            ValueError, match=rf"end in \.onnx.*Received: path={re.escape(repr(target))}$"
        ):
            write()
        assert os.listdir(tmp_path) == [], name
