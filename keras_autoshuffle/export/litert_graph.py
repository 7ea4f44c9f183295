"""The Keras graph LiteRT files are written from: each sliced convolution as one per slice.

A folded ShuffleNet v2 (`folding.fold_model`) sends each branch's output channels to the
later units that read them: one 1x1 conv, then a STRIDED_SLICE per reader. TFLite's int8
CONCATENATION takes its inputs at its output's scale, and each concatenation of the folded
net has its own, so the int8 converter requantized a conv's whole output once per reader
before slicing it (v2 1.0x at 224: 47 such QUANTIZE ops, 51 in all).

`one_conv_per_slice` writes such a conv (with its BatchNormalization and ReLU) as one conv
per slice, each computing only its slice's channels: the same arithmetic per channel, no
slice, and each conv's output read by one concatenation, whose scale the converter gives
the conv's output. The int8 file then has one QUANTIZE (its input's) and ran about 10%
faster; the float file ran at 0.964 [0.935, 0.993] of the sliced one (v2 1.0x at 224, 8
fresh processes; docs/lab-notes/inference.md, issue 53). ONNX files keep one conv and one
Split (`onnx_graph`).
"""

import keras
import numpy as np

from keras_autoshuffle._keras_internals import inbound_nodes, producing_layer
from keras_autoshuffle.export.onnx_support import activation_name
from keras_autoshuffle.folding import copy_layer
from keras_autoshuffle.unit_layers import ChannelSlice, ChannelSplit

# Per-channel layers that may stand between the conv and its slices.
_PER_CHANNEL = (keras.layers.BatchNormalization, keras.layers.ReLU)
_ELEMENTWISE = ("linear", "relu")


def _readers(model):
    """{id(tensor): [layers calling on it]} over `model`'s graph."""
    readers = {}
    for layer in model.operations:
        for tensor in inbound_nodes(layer)[0].input_tensors:
            readers.setdefault(id(tensor), []).append(layer)
    return readers


def _slice_ranges(layer, tensor):
    """[(output tensor, start, stop)] of a ChannelSlice or ChannelSplit call on `tensor`."""
    outputs = inbound_nodes(layer)[0].output_tensors
    if isinstance(layer, ChannelSlice):
        return [(outputs[0], layer.start, layer.stop)]
    half = tensor.shape[-1] // 2
    return [(outputs[0], 0, half), (outputs[1], half, 2 * half)]


def _sliced_chain(tensor, readers):
    """The layers (conv first) that make `tensor`, when only slices read it and it is a
    dense Conv2D's output through per-channel layers each read once; else None."""
    chain = []
    while True:
        layer = producing_layer(tensor)
        if len(readers.get(id(tensor), [])) != 1 and chain:
            return None
        if isinstance(layer, keras.layers.Conv2D):
            # Columns of a dense channels-last conv with an elementwise activation only.
            dense = layer.groups == 1 and layer.data_format == "channels_last"
            return [layer, *chain] if dense and activation_name(layer) in _ELEMENTWISE else None
        per_channel = isinstance(layer, _PER_CHANNEL) and getattr(layer, "axis", -1) in (-1, 3)
        if not per_channel:
            return None
        chain.insert(0, layer)
        tensor = inbound_nodes(layer)[0].input_tensors[0]


def _sliced_convs(model):
    """{id(slice layer): conv chain} for every slice of a chain `_sliced_chain` finds."""
    readers, found = _readers(model), {}
    for layer in model.operations:
        node = inbound_nodes(layer)[0]
        for tensor in node.output_tensors:
            users = readers.get(id(tensor), [])
            if tensor.ndim != 4 or not users:
                continue
            if not all(isinstance(u, (ChannelSlice, ChannelSplit)) for u in users):
                continue
            chain = _sliced_chain(tensor, readers)
            if chain is not None:
                found.update({id(user): chain for user in users})
    return found


def _piece(chain, x, start, stop):
    """`chain` (a conv, then per-channel layers) for output channels start..stop only."""
    columns = np.arange(start, stop)
    for layer in chain:
        weights = layer.get_weights()
        if layer is chain[0]:  # (kh, kw, in, out) kernel, then the bias
            weights = [weights[0][..., columns], *(w[columns] for w in weights[1:])]
            overrides = {"filters": stop - start}
        else:
            weights, overrides = [w[columns] for w in weights], {}
        x = copy_layer(layer, x, weights, name=f"{layer.name}_{start}_{stop}", **overrides)
    return x


def _with_nested_rewritten(model):
    """`model` with each nested model in it rewritten by `one_conv_per_slice`: the
    fine-tune's files wrap the folded net (`metadata.with_input_normalization`,
    `raw_inputs.raw_input_model`); `model` itself when none changes."""
    nested = {
        id(op): one_conv_per_slice(op) for op in model.operations if isinstance(op, keras.Model)
    }
    if all(new is op for op in model.operations for new in [nested.get(id(op), op)]):
        return model
    copies = []

    def clone(layer):
        if id(layer) in nested:
            return nested[id(layer)]
        copies.append((layer, type(layer).from_config(layer.get_config())))
        return copies[-1][1]

    wrapper = keras.models.clone_model(model, clone_function=clone)
    for layer, copy in copies:  # clone_model gives its copies new weights
        if isinstance(layer, keras.layers.Layer):  # a keras op (`x / 255`) holds none
            copy.set_weights(layer.get_weights())
    return wrapper


def _copyable(model):
    """Whether the rewrite can rebuild `model`'s graph layer by layer (`copy_layer` calls
    each copy on its input tensors alone): each operation a layer called once. A keras op
    (`x * 2`) keeps other arguments in its call, a shared layer has several calls."""
    return all(
        isinstance(op, keras.layers.Layer) and len(inbound_nodes(op)) == 1
        for op in model.operations
    )


def one_conv_per_slice(model: keras.Model) -> keras.Model:
    """`model` with each dense conv whose output (through BatchNormalization and ReLU) only
    ChannelSlices or a ChannelSplit read written as one conv per slice (see the module
    docstring), also inside a nested model (a wrapper around the folded net); `model`
    itself when it has none (a rewritten model has none), or when its graph holds a
    Lambda, a keras op or a shared layer (`_copyable`). The outputs are the same up to
    float rounding (each output channel is the same sum of products).

    Args:
        model: a single-input functional Keras model, e.g. a folded ShuffleNet v2.

    Returns:
        A new `keras.Model` (copies of the layers: `model` is left as it was).
    """
    # A Sequential model has no `operations` graph to rewrite; a folded net is functional.
    if not hasattr(model, "operations") or len(model.inputs) != 1 or len(model.outputs) != 1:
        return model
    # Copies are made from configs, and a Lambda's Python function does not load back from
    # its config (Keras's safe mode): a graph with one is written as it is.
    if any(isinstance(op, keras.layers.Lambda) for op in model.operations):
        return model
    model = _with_nested_rewritten(model)
    chains = _sliced_convs(model)
    if not chains or not _copyable(model):
        return model
    replaced = {id(layer) for chain in chains.values() for layer in chain}
    inputs = keras.Input(shape=model.inputs[0].shape[1:], dtype=model.inputs[0].dtype)
    tensors, pieces = {id(model.inputs[0]): inputs}, {}
    for layer in model.operations:
        node = inbound_nodes(layer)[0]
        if isinstance(layer, keras.layers.InputLayer) or id(layer) in replaced:
            continue
        if id(layer) in chains:
            chain = chains[id(layer)]
            source = tensors[id(inbound_nodes(chain[0])[0].input_tensors[0])]
            for output, start, stop in _slice_ranges(layer, node.input_tensors[0]):
                key = (id(chain[0]), start, stop)  # two slices of one range: one piece
                if key not in pieces:
                    pieces[key] = _piece(chain, source, start, stop)
                tensors[id(output)] = pieces[key]
            continue
        ins = [tensors[id(t)] for t in node.input_tensors]
        merge = isinstance(layer, (keras.layers.Concatenate, keras.layers.Add))
        # A copy: calling `layer` itself would give it a second call, and the ONNX writer
        # (`onnx_support`) refuses a layer called twice.
        outputs = copy_layer(layer, ins if merge or len(ins) > 1 else ins[0])
        for old, new in zip(node.output_tensors, keras.tree.flatten(outputs), strict=True):
            tensors[id(old)] = new
    return keras.Model(inputs, tensors[id(model.outputs[0])], name=model.name)
