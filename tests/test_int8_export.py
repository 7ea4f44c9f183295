"""int8 LiteRT export: a real conversion read back by the LiteRT interpreter, its report
checked against the float model's own predictions, the refusal below the thresholds, and
the arguments refused before anything is written."""

import contextlib
import io
import logging
import os
import re
import shutil
import sys
import tempfile

import keras
import numpy as np
import pytest
from helpers import TINY_SHAPE, needs_extra, tiny_v2

from keras_autoshuffle import data, export, folding, training
from keras_autoshuffle.export import onnx_runtimes

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="LiteRT export needs the TensorFlow backend"
)
pytest.importorskip("ai_edge_litert")


def _images(count, seed=0):
    return np.random.default_rng(seed).normal(size=(count, *TINY_SHAPE)).astype("float32")


def _trained_model(train):
    """A tiny v2 trained 3 epochs on the digits (about 75% test accuracy): an untrained
    net's near-uniform softmax rounds to ties in int8, so its top-1 class means nothing."""
    keras.utils.set_random_seed(1)
    model = tiny_v2(classes=10, input_shape=train.input_shape)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    model.fit(train.images, train.labels, batch_size=64, epochs=3, verbose=0)
    return model


def _interpreter_predictions(path, images):
    """Top-1 classes of a `.tflite` file, one image at a time, by the interpreter itself."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    classes = []
    for image in images:
        interpreter.set_tensor(source["index"], image[None])
        interpreter.invoke()
        classes.append(int(np.argmax(interpreter.get_tensor(target["index"])[0])))
    return np.array(classes)


# Every int8 file of one export of the folded net: LiteRT always, ONNX and OpenVINO where
# their extras are installed (the test extra has them).
INT8_FORMATS = ("litert",) + tuple(
    fmt
    for fmt, extra in (("onnx", "onnx"), ("openvino", "openvino-int8"))
    if not export.unsupported_formats((fmt,)) and not export.unsupported_int8((fmt,))
)


@contextlib.contextmanager
def _everything_printed():
    """What the block writes to stdout or stderr, from Python (sys.stdout, sys.stderr, the
    root logger) or from C++ (file descriptors 1 and 2): a list, its one text once the block
    ends."""
    printed = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    records = io.StringIO()
    handler = logging.StreamHandler(records)
    with tempfile.TemporaryFile("w+") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        logging.getLogger().addHandler(handler)
        try:
            with contextlib.redirect_stdout(file), contextlib.redirect_stderr(file):
                yield printed
        finally:
            logging.getLogger().removeHandler(handler)
            file.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            file.seek(0)
            printed.append(file.read() + records.getvalue())


@pytest.fixture(scope="module")
def export_and_screen(tmp_path_factory):
    """`exported`, and what the export printed, run as `autoshuffle-finetune --verbose 0`
    runs it (OpenVINO's converter reads sys.argv)."""
    train, test = data.digits(seed=0, augment=False)
    model = folding.fold_model(_trained_model(train))
    float_classes = np.argmax(model.predict(test.images, verbose=0), axis=-1)
    argv = sys.argv
    sys.argv = ["autoshuffle-finetune", "photos", "--output", "run", "--verbose", "0"]
    try:
        with _everything_printed() as printed:
            results = export.export_model(
                model,
                str(tmp_path_factory.mktemp("int8")),
                test.images[:4],
                formats=INT8_FORMATS,
                quantize="int8",
                representative_data=train.images[:100],
                test_data=(test.images, test.labels),
                # The floors of each runtime are the tests' below.
                min_top1_agreement=0.85,
                max_accuracy_drop=5.0,
            )
    finally:
        sys.argv = argv
    return (results, test.images, test.labels, float_classes), printed[0]


@pytest.fixture(scope="module")
def exported(export_and_screen):
    return export_and_screen[0]


# The runtimes' chatter that reached a fine-tune's screen (issue 52): OpenVINO's converter
# block, LiteRT's converter and interpreter lines, ONNX Runtime's quantizer advice, NNCF's
# progress bars.
CHATTER = re.compile(
    r"Model Conversion arguments|\[ SUCCESS \]|fully_quantize|XNNPACK delegate|"
    r"Please consider|Statistics collection|Fast Bias correction"
)


def test_the_export_prints_none_of_the_runtimes_chatter(export_and_screen):
    (results, *_), printed = export_and_screen
    assert {"int8", "onnx_int8", "openvino_int8"} & set(results)  # the runtimes did run
    assert not CHATTER.findall(printed), printed[-3000:]


def test_int8_report_matches_the_interpreter_and_the_float_model(exported):
    results, images, labels, float_classes = exported
    entry = results["int8"]
    assert entry["path"].endswith("model_int8.tflite") and os.path.isfile(entry["path"])
    int8_classes = _interpreter_predictions(entry["path"], images)
    assert entry["top1_agreement"] == pytest.approx(np.mean(int8_classes == float_classes))
    assert entry["accuracy"] == pytest.approx(np.mean(int8_classes == labels))
    assert entry["float_accuracy"] == pytest.approx(np.mean(float_classes == labels))
    assert entry["float_accuracy"] > 0.5  # the net learned something: top-1 is meaningful
    assert entry["top1_agreement"] >= 0.95
    float_bytes = os.path.getsize(results["litert"]["path"])
    assert entry["size_ratio"] == pytest.approx(float_bytes / os.path.getsize(entry["path"]))
    assert entry["size_ratio"] > 1
    assert (entry["test_examples"], entry["calibration_examples"]) == (len(labels), 100)


def test_int8_file_is_quantized_with_float_inputs_and_outputs(exported):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=exported[0]["int8"]["path"])
    assert interpreter.get_input_details()[0]["dtype"] == np.float32
    assert interpreter.get_output_details()[0]["dtype"] == np.float32
    conv_dtypes = {
        detail["dtype"]
        for detail in interpreter.get_tensor_details()
        if detail["name"].endswith("kernel") or "conv" in detail["name"].lower()
    }
    assert np.int8 in conv_dtypes


@pytest.fixture(scope="module")
def untrained():
    keras.utils.set_random_seed(4)
    return tiny_v2(classes=10)


def test_a_float_export_removes_an_earlier_int8_file(exported, untrained, tmp_path):
    # The old int8 file does not match the new float model beside it.
    shutil.copy(exported[0]["int8"]["path"], tmp_path / "model_int8.tflite")
    export.export_model(untrained, str(tmp_path), _images(2), formats=("litert",))
    assert sorted(os.listdir(tmp_path)) == ["model.tflite"]


def test_quantize_is_compared_by_value(untrained, tmp_path):
    # A string built at run time is not the literal "int8" object: it is accepted (and
    # reaches the int8 checks, here the missing float format to quantize).
    built = "".join(["IN", "T8"]).lower()
    with pytest.raises(ValueError, match="`int8_formats` must be some of them"):
        export.export_model(
            untrained, str(tmp_path / "out"), _images(2), formats=("keras",), quantize=built
        )
    with pytest.raises(ValueError, match=r"Received: quantize=array\('int8'"):
        export.export_model(untrained, str(tmp_path / "out"), _images(2), quantize=np.array("int8"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"quantize": "int4"}, "Received: quantize='int4'"),
        ({"quantize": "INT8"}, "Received: quantize='INT8'"),
        ({"representative_data": "x"}, 'are for quantize="int8"'),
        ({"quantize": "int8", "formats": ("keras",)}, r"int8_formats=\(\), formats=\('keras',\)"),
        ({"quantize": "int8", "int8_formats": ("onnx",)}, r"int8_formats=\('onnx',\), formats"),
        ({"quantize": "int8", "int8_formats": "litert"}, "int8_formats='litert'"),
        ({"int8_formats": ("litert",)}, '`int8_formats` is for quantize="int8"'),
        ({"quantize": "int8", "representative_data": None}, "representative_data=None"),
        ({"quantize": "int8", "representative_data": np.zeros((0, *TINY_SHAPE))}, r"\(0, 16"),
        (
            {"quantize": "int8", "representative_data": np.zeros((4, 8, 8, 3))},
            r"representative_data.shape=\(4, 8, 8, 3\)",
        ),
        (
            {"quantize": "int8", "representative_data": np.full((2, *TINY_SHAPE), np.nan)},
            "`representative_data` must hold only finite values",
        ),
        ({"quantize": "int8", "test_data": None}, "test_data of type NoneType"),
        ({"quantize": "int8", "test_data": (_images(3), [0, 1])}, "labels of shape \\(2,\\)"),
        ({"quantize": "int8", "test_data": (_images(2), [0, 10])}, r"in \[0, 10\)"),
        ({"quantize": "int8", "test_data": (_images(2), [0.5, 1])}, "integer class labels"),
        ({"quantize": "int8", "representative_data": _images(8)}, r"at least 16 inputs"),
        (
            {"quantize": "int8", "representative_data": 255 * np.abs(_images(16))},
            r"preprocessed alike.*\|x\| \d",
        ),
        (
            {"quantize": "int8", "representative_data": np.full((16, *TINY_SHAPE), "1")},
            "real numbers.*dtype <U1",
        ),
        ({"quantize": "int8", "min_top1_agreement": 1.5}, "min_top1_agreement=1.5"),
        ({"quantize": "int8", "max_accuracy_drop": -1}, "max_accuracy_drop=-1"),
    ],
)
def test_bad_arguments_are_refused_before_writing(untrained, tmp_path, kwargs, message):
    arguments = {
        "formats": ("litert",),
        "representative_data": _images(16),
        "test_data": (_images(4), [0, 1, 2, 3]),
        **kwargs,
    }
    if "quantize" not in kwargs and "representative_data" not in kwargs:
        arguments.pop("representative_data")
    if kwargs.get("quantize") is None:
        arguments.pop("test_data")
    with pytest.raises(ValueError, match=message):
        export.export_model(untrained, str(tmp_path / "out"), _images(2), **arguments)
    assert not (tmp_path / "out").exists()


def test_train_refuses_int8_without_litert_before_training(tmp_path):
    rng = np.random.default_rng(0)
    split = data.ArrayData(rng.normal(size=(8, *TINY_SHAPE)), rng.integers(0, 10, 8), 10)
    recipe = training.get_recipe("digits", epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="`int8=True` needs the LiteRT export"):
        training.train(
            lambda: tiny_v2(classes=10, shuffle="auto"),
            split,
            split,
            recipe,
            str(tmp_path / "run"),
            export=False,
            int8=True,
            verbose=0,
        )
    assert not (tmp_path / "run").exists()


def test_a_training_run_keeps_its_float_files_when_int8_is_refused(untrained, tmp_path):
    # After training, a refused int8 file must not cost the run: the float files and the
    # report's numbers stay, marked refused, with no int8 file.
    from keras_autoshuffle.training import exports

    images = _images(48, seed=5)
    # ONNX where installed (its conversions are the quick ones), else LiteRT.
    formats = ("onnx",) if "onnx" in INT8_FORMATS else ("litert",)
    results = exports.export_run(
        untrained, str(tmp_path), images[:2], formats, (images, (images, np.zeros(48, int)))
    )
    keys = [key for key, (fmt, _) in export.INT8_FILES.items() if fmt in formats]
    for key in keys:
        assert results[key]["path"] is None and "minimum 0.99" in results[key]["refused"]
        assert results[key]["top1_agreement"] < 0.99
    float_files = [export.FILENAMES[fmt] for fmt in formats]
    assert sorted(os.listdir(tmp_path)) == sorted(["model.keras", *float_files])


def _entry_matches(entry, classes, float_classes, labels, min_agreement):
    assert entry["top1_agreement"] == pytest.approx(np.mean(classes == float_classes))
    assert entry["accuracy"] == pytest.approx(np.mean(classes == labels))
    assert entry["float_accuracy"] == pytest.approx(np.mean(float_classes == labels))
    assert entry["float_accuracy"] > 0.5  # the net learned something: top-1 is meaningful
    assert entry["top1_agreement"] >= min_agreement
    # No bound on the ratio: in a net this small the scales and zero points weigh as much
    # as the weights (ONNX 0.99x, OpenVINO 0.67x the float file); int8 weights are checked
    # in the file itself.
    assert entry["size_ratio"] == pytest.approx(entry["float_bytes"] / entry["bytes"])


@needs_extra("onnx")
def test_int8_onnx_is_integer_and_its_report_matches_onnx_runtime(exported):
    import onnx

    results, images, labels, float_classes = exported
    entry = results["onnx_int8"]
    path = entry["path"]
    assert path.endswith("model_int8.onnx") and os.path.isfile(path)
    classes = np.argmax(onnx_runtimes.onnx_outputs(path, images), axis=-1)
    # 0.953 on the 2-core AMD EPYC (AVX2, no VNNI), with 7-bit weights (`reduce_range`).
    _entry_matches(entry, classes, float_classes, labels, min_agreement=0.9)
    assert entry["float_bytes"] == os.path.getsize(results["onnx"]["path"])
    proto = onnx.load(path)
    ops = {node.op_type for node in proto.graph.node}
    dequantized = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    convs = [n for n in proto.graph.node if n.op_type in ("Conv", "QLinearConv")]
    assert convs and "QuantizeLinear" in ops
    assert all(n.op_type == "QLinearConv" or n.input[1] in dequantized for n in convs)
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    int8_weights = {t.name for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    assert any(
        n.input[0] in int8_weights for n in proto.graph.node if n.op_type == "DequantizeLinear"
    )


@needs_extra("openvino")
def test_int8_openvino_is_integer_and_its_report_matches_openvino(exported):
    pytest.importorskip("nncf")
    results, images, labels, float_classes = exported
    entry = results["openvino_int8"]
    xml = os.path.join(entry["path"], onnx_runtimes.OPENVINO_XML)
    assert os.path.isfile(xml)
    classes = np.argmax(onnx_runtimes.openvino_outputs(entry["path"], images), axis=-1)
    # 0.897 on the 2-core AMD EPYC (AVX2, no VNNI) with NNCF's overflow fix in every
    # layer (0.775 with its default, the first layer only).
    _entry_matches(entry, classes, float_classes, labels, min_agreement=0.85)
    with open(xml) as file:
        assert 'element_type="i8"' in file.read()  # int8 weights, not fake-quant on f32


def test_int8_files_and_float_files_share_the_folder(exported):
    assert export.INT8_FILES["int8"][1] == export.INT8_FILENAME  # both written out
    results = exported[0]
    folder = os.path.dirname(results["litert"]["path"])
    names = {os.path.basename(entry["path"]) for entry in results.values()}
    assert sorted(os.listdir(folder)) == sorted(names)
    assert {k for k in results if k.endswith("int8")} == {
        key for key, (fmt, _) in export.INT8_FILES.items() if fmt in INT8_FORMATS
    }


def test_refusal_below_the_threshold_leaves_no_int8_file(exported, untrained, tmp_path):
    # An untrained net's softmax is near uniform: int8 rounds it to ties, so its top-1
    # class rarely matches the float one. Whichever int8 file is refused first, none is
    # left: the folder holds all the int8 files asked for or none; an earlier export's
    # int8 files go too.
    formats = INT8_FORMATS[:2]  # LiteRT, and ONNX where installed
    shutil.copy(exported[0]["int8"]["path"], tmp_path / "model_int8.tflite")
    (tmp_path / "model_int8.onnx").write_bytes(b"keras_autoshuffle: an earlier export's file")
    images = _images(48, seed=5)
    with pytest.raises(
        export.Int8CheckError,
        match=r"top-1 agreement with the float model 0\.\d+ \(minimum 0\.99\)",
    ) as info:
        export.export_model(
            untrained,
            str(tmp_path),
            images[:2],
            formats=formats,
            quantize="int8",
            representative_data=images,
            test_data=(images, np.zeros(48, dtype=int)),
        )
    assert info.value.key in ("int8", "onnx_int8")
    assert sorted(os.listdir(tmp_path)) == sorted(export.FILENAMES[fmt] for fmt in formats)


@needs_extra("openvino")
def test_int8_openvino_without_nncf_is_refused_before_writing(untrained, tmp_path, monkeypatch):
    # As where NNCF is not installed: the check names the extra to install.
    from keras_autoshuffle.export import checks

    installed = checks._installed
    monkeypatch.setattr(checks, "_installed", lambda module: module != "nncf" and installed(module))
    with pytest.raises(
        ValueError, match=r"needs nncf \(pip install 'keras-autoshuffle\[openvino-int8\]'\)"
    ):
        export.export_model(
            untrained,
            str(tmp_path / "out"),
            _images(2),
            formats=("openvino",),
            quantize="int8",
            representative_data=_images(16),
            test_data=(_images(4), [0, 1, 2, 3]),
        )
    assert not (tmp_path / "out").exists()


def test_a_relaxed_net_is_not_quantized_even_where_relaxed_exports_are_allowed(tmp_path):
    relaxed = tiny_v2(classes=10, shuffle="auto")
    with pytest.raises(ValueError, match=r"relaxed \(un-hardened\) shuffles.*Received: relaxed"):
        export.export_model(
            relaxed,
            str(tmp_path / "out"),
            _images(2),
            formats=("litert",),
            allow_relaxed=True,
            quantize="int8",
            representative_data=_images(16),
            test_data=(_images(4), [0, 1, 2, 3]),
        )
    assert not (tmp_path / "out").exists()


@needs_extra("openvino")
def test_float_nodes_leave_the_first_convolution_in_float(exported, tmp_path):
    # Each writer with the float file's first convolution named in `float_nodes`: that
    # convolution reads float weights (no DequantizeLinear / quantized constant before it),
    # the next one still int8.
    pytest.importorskip("nncf")
    import onnx
    import openvino

    from keras_autoshuffle.export.int8_runtimes import export_onnx_int8, export_openvino_int8

    results, images = exported[0], exported[1]
    calibration = images[:32]
    first = next(
        n.name for n in onnx.load(results["onnx"]["path"]).graph.node if n.op_type == "Conv"
    )
    path = export_onnx_int8(
        results["onnx"]["path"], str(tmp_path / "first.onnx"), calibration, float_nodes=[first]
    )
    graph = onnx.load(path).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert convs[0].name == first and convs[0].input[1] not in dequantized
    assert convs[1].input[1] in dequantized

    ir = openvino.Core().read_model(
        os.path.join(results["openvino"]["path"], onnx_runtimes.OPENVINO_XML)
    )
    name = next(
        op.get_friendly_name() for op in ir.get_ordered_ops() if op.get_type_name() == "Convolution"
    )
    folder = export_openvino_int8(
        results["openvino"]["path"], str(tmp_path / "first_ov"), calibration, float_nodes=[name]
    )
    quantized = openvino.Core().read_model(os.path.join(folder, onnx_runtimes.OPENVINO_XML))
    # The op feeding each convolution's weights: a float32 Constant where left in float,
    # else NNCF's int8 weight decompression (Convert / Subtract / Multiply).
    weights = {
        op.get_friendly_name(): op.input_value(1).get_node()
        for op in quantized.get_ordered_ops()
        if op.get_type_name() == "Convolution"
    }
    assert weights[name].get_type_name() == "Constant"
    assert weights[name].get_element_type() == openvino.Type.f32
    others = [source for other, source in weights.items() if other != name]
    assert others and others[0].get_type_name() != "Constant"


@needs_extra("openvino")
@pytest.mark.parametrize("float_nodes", [["no_such_node"], "stem_conv", [3]])
def test_float_nodes_not_in_the_graph_are_refused_before_writing(exported, tmp_path, float_nodes):
    # ONNX Runtime would ignore an unknown name and quantize the node meant to stay float.
    pytest.importorskip("nncf")
    from keras_autoshuffle.export.int8_runtimes import export_onnx_int8, export_openvino_int8

    results, images = exported[0], exported[1]
    for writer, key, target in (
        (export_onnx_int8, "onnx", tmp_path / "x.onnx"),
        (export_openvino_int8, "openvino", tmp_path / "x_ov"),
    ):
        with pytest.raises(ValueError, match=r"float_nodes.*Received: float_nodes="):
            writer(results[key]["path"], str(target), images[:32], float_nodes=float_nodes)
        assert not target.exists()
