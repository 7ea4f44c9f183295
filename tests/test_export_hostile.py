"""Export under hostile use (issue 39): OpenVINO's precision and a Gather it computed wrongly,
folders holding an earlier export or a user's files, unknown spatial sizes, bad numbers,
hard-forward shuffles, odd format lists. Every refusal comes before anything is written."""

import ast
import os
import pathlib

import keras
import numpy as np
import pytest
from helpers import needs_extra, tiny_v2
from keras import layers

from keras_autoshuffle import RelaxedShuffle, export, harden_model
from keras_autoshuffle.applications import AutoShuffleNetV2, ShuffleNetV2

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_openvino = needs_extra("openvino")
needs_onnx = needs_extra("onnx")


def _gather_model(seed=0):
    """Conv2D(16, 1) -> hardened RelaxedShuffle -> two Conv2D(16, 1) -> Concatenate: the
    case OpenVINO 2026.4 computed wrongly from a Gather on axis 1."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(16, 1)(inputs)
    x = RelaxedShuffle(permutation=np.random.default_rng(seed).permutation(16))(x)
    outputs = layers.Concatenate()([layers.Conv2D(16, 1)(x), layers.Conv2D(16, 1)(x)])
    return keras.Model(inputs, outputs)


def _images(batch=2, side=8, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, side, side, 3)).astype("float32")


def _small(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(8, 3, padding="same")(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(4)(x))


# 1. OpenVINO's inference precision.


def _compile_model_calls():
    """(file, line, enclosing source) of every `.compile_model(` call in the package and
    the experiments."""
    found = []
    for folder in ("keras_autoshuffle", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "compile_model"
                ):
                    around = [
                        f
                        for f in functions
                        if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)
                    ]
                    body = ast.get_source_segment(source, around[-1]) if around else source
                    found.append((str(path.relative_to(ROOT)), node.lineno, body))
    return found


def test_every_openvino_compile_names_its_inference_precision():
    # OpenVINO's CPU plugin runs a float32 model in bfloat16 on CPUs with AVX512_BF16 or
    # AMX unless told: every compile must name the precision (this CPU cannot show it).
    calls = _compile_model_calls()
    assert calls, "no compile_model call found"
    for path, line, body in calls:
        assert "INFERENCE_PRECISION_HINT" in body or "openvino_config(" in body, (
            f"{path}:{line}: compile_model without INFERENCE_PRECISION_HINT"
        )


def test_the_openvino_config_is_float32_unless_asked():
    assert export.openvino_config()["INFERENCE_PRECISION_HINT"] == "f32"
    assert export.openvino_config(2, "bf16") == {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "bf16",
        "INFERENCE_NUM_THREADS": 2,
    }
    for bad in ("fp32", None, 32):
        with pytest.raises(ValueError, match="Received: precision="):
            export.openvino_config(precision=bad)


@needs_openvino
def test_the_compiled_openvino_model_runs_in_float32(tmp_path, monkeypatch):
    import openvino

    path = export.export_openvino(_small(), str(tmp_path / "openvino"))
    compiled = export.openvino_model(path)
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32
    # An explicit bf16 request reaches the plugin (which may fall back to f32 on a CPU
    # without bf16 units, so the config handed to it is checked, not the property).
    seen = {}
    original = openvino.Core.compile_model

    def spy(self, model, device, config=None):
        seen.update(config or {})
        return original(self, model, device, config)

    monkeypatch.setattr(openvino.Core, "compile_model", spy)
    export.openvino_model(path, precision="bf16")
    assert seen["INFERENCE_PRECISION_HINT"] == "bf16"
    with pytest.raises(ValueError, match="Received: precision='fp32'"):
        export.openvino_model(path, precision="fp32")


def test_the_timing_child_compiles_openvino_in_the_precision_asked(monkeypatch):
    from experiments import runtime_processes

    openvino = pytest.importorskip("openvino")
    seen = []

    class Core:
        def read_model(self, path):
            class Model:
                inputs = [None]

                def reshape(self, shapes):
                    pass

            return Model()

        def compile_model(self, model, device, config):
            seen.append(config["INFERENCE_PRECISION_HINT"])
            return lambda a: a

    monkeypatch.setattr(openvino, "Core", Core)
    x = _images(1)
    runtime_processes._calls("openvino", {"a": "a.xml"}, 1, x)
    runtime_processes._calls("openvino", {"a": "a.xml"}, 1, x, precision="bf16")
    assert seen == ["f32", "bf16"]


# 2. OpenVINO and a Gather of the channels.


@needs_openvino
def test_openvino_computes_a_gather_read_by_two_convs(tmp_path):
    model = _gather_model()
    x = _images()
    path = export.export_openvino(model, str(tmp_path / "openvino"))
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(export.open_runner(path).run(x), expected, atol=1e-5, rtol=0)


@needs_openvino
def test_openvino_computes_an_unfolded_hardened_autoshufflenet_v2(tmp_path):
    keras.utils.set_random_seed(1)
    model = AutoShuffleNetV2(0.5, input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    rng = np.random.default_rng(1)
    for layer in model.layers:  # BatchNormalization statistics that show a mistake
        if isinstance(layer, layers.BatchNormalization):
            n = layer.get_weights()[0].size
            layer.set_weights(
                [rng.uniform(0.5, 1.5, n), rng.normal(size=n) * 0.2]
                + [rng.normal(size=n) * 0.2, rng.uniform(0.5, 1.5, n)]
            )
    harden_model(model)
    x = _images(2, 32)
    result = export.export_model(model, str(tmp_path), x, formats=("openvino",))
    assert result["openvino"]["max_abs_diff"] <= 1e-4


# 8. One folder, one consistent export.


@pytest.mark.tensorflow_only(reason="LiteRT export")
def test_an_earlier_export_of_another_model_is_cleared(tmp_path):
    x = _images()
    export.export_model(_small(0), str(tmp_path), x, formats=("keras", "litert"))
    (tmp_path / "notes.txt").write_text("mine")
    export.export_model(_small(1), str(tmp_path), x, formats=("keras",))
    # The old LiteRT file computes another net: removed; the user's file stays.
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "notes.txt"]


@pytest.mark.tensorflow_only(reason="LiteRT export")
def test_an_earlier_file_of_the_same_model_is_kept(tmp_path):
    # As a training run does: the .keras file, then the other formats in a second call.
    model, x = _small(), _images()
    export.export_model(model, str(tmp_path), x, formats=("keras",))
    export.export_model(model, str(tmp_path), x, formats=("litert",))
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "model.tflite"]


def test_a_users_file_at_an_export_name_is_refused_not_removed(tmp_path):
    (tmp_path / "model.tflite").write_text("my notes")
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "saved_model" / "mine.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds \['saved_model', 'model.tflite'\].*output_dir="):
        export.export_model(_small(), str(tmp_path), _images(), formats=("keras",))
    assert sorted(os.listdir(tmp_path)) == ["model.tflite", "saved_model"]
    assert (tmp_path / "model.tflite").read_text() == "my notes"


def test_a_file_failing_its_check_is_removed_with_the_stale_ones(tmp_path):
    x = _images()
    export.export_model(_small(0), str(tmp_path), x, formats=("keras",))
    reference = _small(1)  # another net: the check fails
    with pytest.raises(ValueError, match="differs from the Keras model"):
        export.export_model(_small(0), str(tmp_path), x, formats=("keras",), reference=reference)
    assert os.listdir(tmp_path) == []


# 9. Unknown spatial sizes: the default feature extractor.


@pytest.mark.slow  # a tiny net of unknown side to ONNX (twice) and LiteRT: 17 s of CPU
@pytest.mark.tensorflow_only(reason="LiteRT export; Keras's ONNX exporter (tf2onnx)")
def test_the_default_feature_extractor_exports(tmp_path):
    # The builder's default input is of unknown side; the files are written from a tiny
    # net of the same kind (the real 0.5x's ONNX and LiteRT conversions took 42 s in CI).
    assert tuple(ShuffleNetV2(0.5, include_top=False).inputs[0].shape) == (None, None, None, 3)
    feature_extractor = dict(include_top=False, pooling="avg", input_shape=(None, None, 3))
    model = tiny_v2(**feature_extractor)
    formats = ("litert",) + (("onnx",) if not export.unsupported_formats(("onnx",)) else ())
    if formats == ("litert",) and export.unsupported_formats(("litert",)):
        pytest.skip("needs ai_edge_litert")
    # A fresh model (never called) straight to the writer: built at a known side first.
    if "onnx" in formats:
        fresh = tiny_v2(**feature_extractor)
        path = export.export_onnx(fresh, str(tmp_path / "fresh.onnx"))
        y = _images(1, 40)
        np.testing.assert_allclose(
            export.open_runner(path).run(y), keras.ops.convert_to_numpy(fresh(y)), atol=1e-4
        )
    result = export.export_model(model, str(tmp_path / "out"), _images(2, 32), formats=formats)
    assert all(entry["max_abs_diff"] <= 1e-4 for entry in result.values())
    # Another side than the parity check's, through the same file.
    y = _images(1, 48)
    np.testing.assert_allclose(
        export.open_runner(result["litert"]["path"]).run(y),
        keras.ops.convert_to_numpy(model(y)),
        atol=1e-4,
    )


# 17. Numbers checked before anything is written.


@pytest.mark.parametrize(
    "argument, value",
    [
        ("atol", float("nan")),
        ("atol", float("inf")),
        ("atol", -1e-4),
        ("rtol", float("nan")),
        ("rtol", "1e-4"),
        ("atol", True),
        ("max_accuracy_drop", float("nan")),
        ("max_accuracy_drop", -1.0),
        ("allow_relaxed", "yes"),
    ],
)
def test_bad_numbers_are_refused_before_anything_is_written(tmp_path, argument, value):
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match=f"Received: {argument}="):
        export.export_model(
            _small(), str(folder), _images(), formats=("keras",), **{argument: value}
        )
    assert not folder.exists()


def test_non_finite_outputs_are_refused_before_anything_is_written(tmp_path):
    model = _small()
    model.layers[-1].set_weights([np.full((8, 4), np.nan), np.zeros(4)])
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="not all finite"):
        export.export_model(model, str(folder), _images(), formats=("keras",))
    assert not folder.exists()


def test_a_reference_of_another_shape_is_refused_before_anything_is_written(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    other = keras.Model(inputs, layers.Dense(3)(layers.GlobalAveragePooling2D()(inputs)))
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="reference outputs of shape"):
        export.export_model(_small(), str(folder), _images(), formats=("keras",), reference=other)
    with pytest.raises(ValueError, match="Received: reference of type str"):
        export.export_model(_small(), str(folder), _images(), formats=("keras",), reference="m")
    assert not folder.exists()


# 18. Hard-forward relaxed shuffles.


def _hard_relaxed():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(8, 1)(inputs)
    x = RelaxedShuffle(forward="hard", seed=1, name="hard_shuffle")(x)
    return keras.Model(inputs, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("fmt", ["openvino", "saved_model"])
def test_hard_forward_relaxed_shuffles_are_refused_up_front(tmp_path, fmt):
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match=r"forward='hard' layers=\['hard_shuffle'\]"):
        export.export_model(
            _hard_relaxed(), str(folder), _images(), formats=("keras", fmt), allow_relaxed=True
        )
    assert not folder.exists()


@needs_openvino
def test_the_openvino_writer_refuses_hard_forward_shuffles(tmp_path):
    with pytest.raises(ValueError, match="OpenVINO cannot convert it"):
        export.export_openvino(_hard_relaxed(), str(tmp_path / "openvino"))
    assert not list(tmp_path.iterdir())


# Probes.


@pytest.mark.parametrize(
    "formats", [("keras", "keras"), (), "pdf", ("keras", None), ["KERAS"], {"keras": 1}.items()]
)
def test_odd_format_lists_are_refused_before_anything_is_written(tmp_path, formats):
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="Received: formats="):
        export.export_model(_small(), str(folder), _images(), formats=formats)
    assert not folder.exists()


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="must be a folder"):
        export.export_model(_small(), str(tmp_path / "f"), _images(), formats=("keras",))


@pytest.mark.tensorflow_only(reason="LiteRT export")
@pytest.mark.parametrize("batch", [1, 7])
def test_litert_parity_at_odd_batch_sizes(tmp_path, batch):
    result = export.export_model(_small(), str(tmp_path), _images(batch), formats=("litert",))
    assert result["litert"]["max_abs_diff"] <= 1e-5
