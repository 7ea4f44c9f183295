"""The Keras internals `keras_autoshuffle/_keras_internals.py` uses, checked against the
installed Keras: a release that renames or changes one fails here, naming it, rather than
silently for users. And no other module of the package uses a private Keras name."""

import ast
import pathlib

import h5py
import keras
import numpy as np
import pytest

from keras_autoshuffle import _keras_internals as internals

PACKAGE = pathlib.Path(internals.__file__).parent


def _require(obj, *names):
    for name in names:
        assert hasattr(obj, name), (
            f"Keras {keras.__version__} changed its internals: {type(obj).__name__} has no "
            f"`{name}`, which keras_autoshuffle/_keras_internals.py uses. Update that module."
        )


def test_layer_variable_internals():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    _require(layer, "_untrack_variable")
    _require(layer.kernel, "_value")
    assert not internals.has_no_value(layer.kernel)
    internals.untrack_variable(layer, layer.bias)
    assert [id(v) for v in layer.weights] == [id(layer.kernel)], "_untrack_variable"


def test_weight_decay_internal():
    optimizer = keras.optimizers.SGD(weight_decay=0.1)
    kept, excluded = keras.Variable(np.ones(2)), keras.Variable(np.ones(2))
    optimizer.exclude_from_weight_decay(var_list=[excluded])
    optimizer.build([kept, excluded])
    _require(optimizer, "_use_weight_decay")
    assert internals.uses_weight_decay(optimizer, kept), "_use_weight_decay"
    assert not internals.uses_weight_decay(optimizer, excluded), "_use_weight_decay"


def test_optimizer_variable_lists():
    a, b = keras.Variable(np.ones(2)), keras.Variable(np.full(3, 2.0))
    optimizer = keras.optimizers.SGD(momentum=0.9, use_ema=True)
    optimizer.build([a, b])
    names = "_trainable_variables", "_trainable_variables_indices", "_var_key"
    _require(optimizer, *names, "_model_variables_moving_average")
    internals.drop_optimizer_variables(optimizer, {id(b)})
    assert [id(v) for v in optimizer._trainable_variables] == [id(b)], names[0]
    assert list(optimizer._trainable_variables_indices) == [optimizer._var_key(b)], names[1]
    averages = optimizer._model_variables_moving_average
    assert [tuple(v.shape) for v in averages] == [(3,)], "_model_variables_moving_average"
    # The kept variable still updates with its own momentum slot.
    optimizer.apply([keras.ops.ones(3)], [b])
    assert np.all(keras.ops.convert_to_numpy(b) < 2.0), "_trainable_variables_indices"
    inner = keras.optimizers.SGD()
    multi = keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(inner))
    _require(multi, "_inner_optimizers")
    assert inner in multi._inner_optimizers, "_inner_optimizers"


def test_build_before_fit_traces_the_train_step_once():
    """`_symbolic_build` builds the compiled metrics and the optimizer from a dataset's
    specs, so `fit` traces the step once: without it, Keras's TensorFlow trainer traces it
    twice (the first trace creates the metrics' variables)."""
    import tensorflow as tf

    def traces(build):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        count = []
        step = model.train_step
        model.train_step = lambda *args: count.append(1) or step(*args)
        data = tf.data.Dataset.from_tensor_slices((np.ones((8, 3), "float32"), np.zeros(8)))
        data = data.batch(4)
        if build:
            _require(model, "_symbolic_build")
            internals.build_before_fit(model, data.element_spec)
            assert model.optimizer.built and len(model.metrics_variables) == 4  # loss, accuracy
        model.fit(data, epochs=2, verbose=0)
        return len(count)

    assert traces(build=True) == 1
    if keras.backend.backend() == "tensorflow":  # what the helper is for
        assert traces(build=False) == 2


def test_initial_epoch_internal(tmp_path):
    def model():
        net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        net.compile(optimizer="sgd", loss="mse")
        return net

    data = np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32")
    first = model()
    _require(first, "_initial_epoch")
    assert internals.initial_epoch(first) == 0
    backup = keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)
    first.fit(*data, epochs=2, verbose=0, callbacks=[backup])
    resumed = model()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    backup.set_model(resumed)
    backup.on_train_begin()
    assert internals.initial_epoch(resumed) == 2, "BackupAndRestore no longer sets _initial_epoch"


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_weights_file_layout(tmp_path, suffix):
    net = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2), keras.layers.ReLU()]
    )
    path = str(tmp_path / f"net{suffix}")
    net.save_weights(path) if suffix == ".weights.h5" else net.save(path)
    message = "Keras's weights-file layout changed (model.weights.h5, layers/<class>_<n>)"
    assert internals.count_layer_entries(path, "dense") == 2, message
    assert internals.count_layer_entries(path, "re_lu") == 1, message
    with h5py.File(tmp_path / "empty.h5", "w"):
        pass
    assert internals.count_layer_entries(str(tmp_path / "empty.h5"), "dense") == 0


def private_keras_uses(source):
    """[(line, name)] of the private names `source` uses that the package does not define,
    and of its imports of `keras.src` and mentions of Keras's private file layout."""
    uses = _private_uses(ast.parse(source))
    return sorted((line, name) for line, name in uses if name not in _package_names())


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _private_uses(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            yield node.lineno, node.attr
        elif isinstance(node, ast.Call):
            function = node.func
            called = getattr(function, "id", getattr(function, "attr", None))
            if called in ("getattr", "hasattr", "setattr", "delattr", "__setattr__"):
                for arg in node.args[1:2]:
                    if isinstance(arg, ast.Constant) and _private(str(arg.value)):
                        yield node.lineno, arg.value
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(m == "keras.src" or m.startswith("keras.src.") for m in modules):
                yield node.lineno, "keras.src"
        elif isinstance(node, ast.Constant) and node.value == "model.weights.h5":
            yield node.lineno, "model.weights.h5"


_DEFINED = None


def _package_names():
    """The private names the package defines: its modules, functions, classes, module
    names, and attributes it sets on `self` / `cls`."""
    global _DEFINED
    if _DEFINED is None:
        names = {path.stem for path in PACKAGE.rglob("_*.py")}
        for path in PACKAGE.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and getattr(node.value, "id", None) in ("self", "cls")
                ):
                    names.add(node.attr)
        _DEFINED = {name for name in names if _private(name)}
    return _DEFINED


def test_the_check_catches_private_keras_names():
    source = (
        "import keras.src.layers\n"
        "from keras.src import ops\n"
        "model._initial_epoch\n"
        'getattr(optimizer, "_var_key")\n'
        'open("model.weights.h5")\n'
        "layer._permutation\n"  # the package's own (RelaxedShuffle sets it)
    )
    names = [name for _, name in private_keras_uses(source)]
    assert names == ["keras.src", "keras.src", "_initial_epoch", "_var_key", "model.weights.h5"]


def test_no_private_keras_names_outside_the_internals_module():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_keras_internals.py"
        for line, name in private_keras_uses(path.read_text())
    ]
    assert not found, (
        "Keras internals outside keras_autoshuffle/_keras_internals.py (move them there, "
        "with a comment saying why no public API does it):\n" + "\n".join(found)
    )


def test_graph_walk_internals():
    # The ONNX writer (export/onnx_graph.py) walks a functional graph through these.
    inputs = keras.Input((4, 4, 3))
    conv = keras.layers.Conv2D(2, 1)
    relu = keras.layers.ReLU()
    hidden = conv(inputs)
    model = keras.Model(inputs, relu(hidden))
    _require(conv, "_inbound_nodes")
    _require(hidden, "_keras_history")
    assert len(internals.inbound_nodes(conv)) == 1
    assert internals.inbound_nodes(relu)[0].input_tensors[0] is hidden
    assert internals.producing_layer(hidden) is conv
    assert internals.producing_layer(model.output) is relu
    sequential = keras.Sequential([keras.layers.Dense(1)])
    sequential.build((None, 2))
    _require(sequential, "_called")
    assert sequential.built and not internals.is_called(sequential)
    sequential(np.zeros((1, 2), "float32"))
    assert internals.is_called(sequential)


def test_preset_weights_file_names():
    from keras_hub.src.utils import preset_utils

    from keras_autoshuffle._keras_internals import PRESET_WEIGHTS_FILES

    assert PRESET_WEIGHTS_FILES == (preset_utils.MODEL_WEIGHTS_FILE, preset_utils.TASK_WEIGHTS_FILE)
