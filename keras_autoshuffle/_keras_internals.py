"""The one place the package touches Keras internals: private attributes and file layouts.

Each helper says what it does and why no public API does it. pyproject.toml pins Keras to
the tested minor version, and tests/test_keras_internals.py checks every name used here
against the installed Keras (and that no other module of the package uses one), so a
Keras release that changes them fails in CI rather than silently for users.
"""

import io
import re
import zipfile

# The weights files of a keras-hub preset folder (`keras_hub.src.utils.preset_utils`'s
# MODEL_WEIGHTS_FILE and TASK_WEIGHTS_FILE): keras-hub exports no name for them, and a
# preset folder's check must name the file a user is missing.
PRESET_WEIGHTS_FILES = ("model.weights.h5", "task.weights.h5")


def has_no_value(variable):
    """True while a variable's value lives outside it: Keras's JAX trainer detaches the
    values during `fit` (`variable._value` is None until `model.jax_state_sync()`).
    No public API tells a detached variable apart; reading it fails with a TypeError."""
    return getattr(variable, "_value", 0) is None


def untrack_variable(layer, variable):
    """Removes `variable` from `layer`'s weights (`Layer._untrack_variable`). Keras has no
    public way to delete a weight; `Dense.quantize` uses the same private method."""
    layer._untrack_variable(variable)


def uses_weight_decay(optimizer, variable):
    """Whether `optimizer` decays `variable` (`Optimizer._use_weight_decay`): the only
    reading of `exclude_from_weight_decay`, which Keras exposes for setting only."""
    return optimizer._use_weight_decay(variable)


def initial_epoch(model):
    """The epochs a resumed `fit` skips, as `BackupAndRestore` restored them: Keras keeps
    the count in the model's private `_initial_epoch` (what `fit` reads); no public API
    returns it."""
    return getattr(model, "_initial_epoch", None) or 0


def one_pass(dataset):
    """`evaluate`'s or `predict`'s `x` (and `steps`) for one pass of a finite tf.data
    dataset through one iterator. Given the dataset, Keras's epoch iterator opens it twice
    (at the pass's end it opens the next pass's), each instantiating the pipeline's
    functions again (an image folder's decoding among them); given it repeated with its
    cardinality as `steps`, once. Anything else is returned as `x` unchanged."""
    cardinality = getattr(dataset, "cardinality", None)
    steps = int(cardinality()) if callable(cardinality) else -1
    if steps <= 0:
        return {"x": dataset}
    return {"x": dataset.repeat(), "steps": steps}


def build_before_fit(model, element_spec):
    """Builds a compiled `model`'s metrics, loss state and optimizer for batches of
    `element_spec` (a dataset's `(inputs, labels)` specs) before `fit`, as
    `Trainer._symbolic_build` does. Without a distribution strategy, Keras's TensorFlow
    trainer leaves this to the train function's first trace, whose creation of the
    metrics' variables makes `tf.function` trace the step a second time: one more trace of
    the whole network per `fit` (seconds for a ShuffleNet). No public API builds the
    compiled metrics."""
    model._symbolic_build(data_batch=tuple(element_spec))


def drop_optimizer_variables(optimizer, kept):
    """Removes from a built optimizer the trainable variables whose id is not in `kept`.

    Keras optimizers have no API for it. The list they were built with is the private
    `_trainable_variables`; the slot lists (momentums, ...) are indexed through
    `_trainable_variables_indices` (keyed by `_var_key`), so the other variables keep
    their slots, and EMA's `_model_variables_moving_average` is paired with the list by
    position. A LossScaleOptimizer's `inner_optimizer` and a MultiOptimizer's private
    `_inner_optimizers` are walked too.
    """
    if optimizer is None or not getattr(optimizer, "built", False):
        return
    inner = [
        getattr(optimizer, "inner_optimizer", None),
        *getattr(optimizer, "_inner_optimizers", []),
    ]
    for sub in inner:
        drop_optimizer_variables(sub, kept)
    built = list(getattr(optimizer, "_trainable_variables", []))
    positions = [i for i, v in enumerate(built) if id(v) in kept]
    if len(positions) == len(built):
        return
    for variable in built:
        if id(variable) not in kept:
            optimizer._trainable_variables_indices.pop(optimizer._var_key(variable), None)
    # object.__setattr__ as `build` does without tracking: the optimizer's __setattr__ would
    # track the model's variables as its own, and changing TensorFlow's list wrapper in
    # place would make the optimizer unsaveable.
    object.__setattr__(optimizer, "_trainable_variables", [built[i] for i in positions])
    averages = getattr(optimizer, "_model_variables_moving_average", None)
    if averages is not None and len(averages) == len(built):
        object.__setattr__(
            optimizer, "_model_variables_moving_average", [averages[i] for i in positions]
        )


def count_layer_entries(path, class_name):
    """How many layers of the class whose snake_case name is `class_name` a Keras weights
    file (`.weights.h5`, or a `.keras` archive) holds.

    Keras's file layout is private: a `.keras` archive keeps its weights in the member
    `model.weights.h5`, and the HDF5 file names a layer's entry by its class
    (`layers/relaxed_shuffle_3`), with or without variables. No public API lists a file's
    layers without building the model. Raises OSError, KeyError or zipfile.BadZipFile on
    a file that is neither.
    """
    import h5py

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            handle = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
    else:
        handle = h5py.File(path, "r")
    names = []
    with handle:
        handle.visit(names.append)
    pattern = re.compile(re.escape(class_name) + r"(_\d+)?")
    return sum(bool(pattern.fullmatch(name.rsplit("/", 1)[-1])) for name in names)


def inbound_nodes(layer):
    """The nodes where `layer` was called in a functional graph (`_inbound_nodes`): the ONNX
    writer walks the graph layer by layer, and no public API lists a layer's calls."""
    return layer._inbound_nodes


def producing_layer(tensor):
    """The layer whose call made the symbolic `tensor` (`_keras_history[0]`): no public API
    maps a functional graph's tensor to its layer."""
    return tensor._keras_history[0]


def is_called(model):
    """Whether `model` has been called (`_called`): Keras's exporters trace a model built by
    a call, and `built` is also true of a model built without one."""
    return model._called
