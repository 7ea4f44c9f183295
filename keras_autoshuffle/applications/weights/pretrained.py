"""From a builder's `weights=` to a Keras weights file: torchvision's ImageNet checkpoints
behind `weights="imagenet"` or an entry's name, downloaded (`download`), read without torch,
converted and cached once as `<cache>/models/<checkpoint>[_notop].weights.h5`
(`converted_weights`); and what any Keras weights file says of the net it fits (its learned
shuffles, the padding it was marked with). The entries (`registry.CHECKPOINTS`) are read at
each call: a test that replaces one is seen here too.
"""

import math
import os
import zipfile

import keras

from keras_autoshuffle import _keras_internals
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.architecture import REPEATS, V2_CONFIGS
from keras_autoshuffle.applications.weights import registry
from keras_autoshuffle.applications.weights.download import (
    download_checkpoint,
    partial_path,
    remove_dead_partials,
)
from keras_autoshuffle.applications.weights.registry import (
    CACHE_SUBDIR,
    CHECKPOINTS,
    cache_dir,
)
from keras_autoshuffle.applications.weights.torch_checkpoint import read_torch_checkpoint
from keras_autoshuffle.applications.weights.torchvision import load_torchvision_weights

# The HDF5 attribute that records the padding of the nets a weights file fits
# (`mark_padding`, `file_padding`).
PADDING_ATTRIBUTE = "keras_autoshuffle_padding"

# What a converted file in the cache may declare before any of it is read: floating-point
# datasets (float32 as written) in the file itself, at most this many, of at most twice
# the checkpoint's parameter count in all (the BatchNorm statistics add fewer values than
# the parameters), and no links (a soft or external link could lead Keras's loader to
# another file or object).
MAX_CACHED_DATASETS = 10_000


def _declared_values(handle, entry):
    """Checks what the HDF5 file `handle` declares (no data read): its links, each
    dataset's dtype, storage and shape against the net's size; ValueError naming the first
    that does not fit."""
    import h5py

    limit = 2 * entry.num_params + 2**16
    total, count = 0, 0

    links = []  # (h5py fails on an exception raised inside visititems_links)

    def link(name, target):
        if not isinstance(target, h5py.HardLink):
            links.append(name)

    def dataset(name, item):
        nonlocal total, count
        if not isinstance(item, h5py.Dataset):
            return
        count += 1
        if count > MAX_CACHED_DATASETS:
            raise ValueError(f"more than {MAX_CACHED_DATASETS} datasets")
        if item.dtype.kind != "f" or item.dtype.itemsize > 8:
            raise ValueError(f"dataset {name!r} holds {item.dtype}, not floating-point numbers")
        if item.is_virtual or item.external:
            raise ValueError(f"dataset {name!r} is stored outside the file (virtual or external)")
        chunk = math.prod(item.chunks) if item.chunks else 0
        total += item.size
        if total > limit or chunk > limit:
            raise ValueError(
                f"dataset {name!r} declares shape {item.shape} (chunks {item.chunks}), which "
                f"brings the file to {total} values, more than the {limit} that ShuffleNetV2 "
                f"with {entry.num_params} parameters can have; nothing was read"
            )

    handle.visititems_links(link)
    if links:
        raise ValueError(f"{links[0]!r} is a soft or external link (this package writes none)")
    handle.visititems(dataset)
    padding = handle.attrs.get_id(PADDING_ATTRIBUTE) if PADDING_ATTRIBUTE in handle.attrs else None
    if padding is not None and (padding.shape != () or padding.get_storage_size() > 1024):
        raise ValueError(f"the attribute {PADDING_ATTRIBUTE} of shape {padding.shape}")


def _check_cached(path, entry, weights="imagenet"):
    """Refuses a converted weights file in the cache that cannot be read whole (empty,
    truncated, damaged, not HDF5, a folder) or that declares more than the net it holds
    (checked before reading anything), naming it: it would fail every later call."""
    import h5py

    def read(_, item):
        if isinstance(item, h5py.Dataset):
            item[()]

    try:
        if not os.path.isfile(path):
            raise IsADirectoryError("not a regular file")
        with h5py.File(path, "r") as handle:
            _declared_values(handle, entry)
            if handle.attrs.get(PADDING_ATTRIBUTE) not in ("torch", b"torch"):
                raise ValueError("not marked as converted from torchvision (padding 'torch')")
            handle.visititems(read)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as error:
        raise ValueError(
            f"The cached ImageNet weights file {path} cannot be read ({type(error).__name__}: "
            f"{error}): it is damaged (e.g. truncated by a full disk) or not this package's. "
            "Delete it, and it is converted again from torchvision's checkpoint at the next "
            f"call (or replace it with a good copy). Received: weights={weights!r}"
        ) from None


def converted_weights(width, include_top, build, weights="imagenet"):
    """The Keras weights file of torchvision's ImageNet ShuffleNetV2 at `width`, from the
    cache, or downloaded, read (no torch), converted and cached once.

    Args:
        width: a key of `CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).
        include_top: with the classifier, or without it (`..._notop.weights.h5`).
        build: a function of no arguments building the ShuffleNetV2 with manual shuffles
            at `width` (ImageNet stem, PyTorch's padding, `include_top`, the checkpoint's
            classes) the checkpoint is converted into; called only on a cache miss.
        weights: what the builder was given ("imagenet" or the entry's name), for the
            errors' `Received: weights=...`.

    Returns:
        The path of `<cache>/models/<checkpoint>[_notop].weights.h5`, marked as fitting
        nets with PyTorch's padding.
    """
    entry = CHECKPOINTS[width]
    suffix = "" if include_top else "_notop"
    path = os.path.join(cache_dir(), CACHE_SUBDIR, f"{entry.stem}{suffix}.weights.h5")
    if os.path.lexists(path):
        _check_cached(path, entry, weights)
        return path
    checkpoint = download_checkpoint(width, weights)
    state_dict = read_torch_checkpoint(checkpoint)
    model = build()
    try:
        load_torchvision_weights(model, state_dict)
    except ValueError as error:
        raise ValueError(
            f"The checkpoint {checkpoint} (from {entry.url}) does not convert to "
            f"ShuffleNetV2 x{width:g}: {error}"
        ) from None
    remove_dead_partials(os.path.dirname(path))
    partial = partial_path(os.path.dirname(path), f"{entry.stem}{suffix}", "partial.weights.h5")
    try:
        model.save_weights(partial)
        mark_padding(partial, "torch")
        os.replace(partial, path)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def imagenet_weights_file(model, include_top, classes, build, weights="imagenet"):
    """For a builder's `weights="imagenet"` or `weights=<entry name>`: checks that `model`
    is the network the checkpoint fits and returns the converted weights file
    (`converted_weights`).

    Args:
        model: the ShuffleNetV2 / AutoShuffleNetV2 just built (ImageNet stem, PyTorch's
            padding, torchvision's width and stage repeats).
        include_top: whether the model has the classifier.
        classes: its class count; with `include_top`, the checkpoint's (1000).
        build: builds the same net with manual shuffles, for `converted_weights`.
        weights: "imagenet" (the checkpoint of the model's width) or a registry name
            (`registry.names()`, either spelling), which must be of the model's width.

    Returns:
        The path of the Keras weights file to load.
    """
    named = registry.named(weights)
    shape = tuple(model.inputs[0].shape[1:])
    channels = shape[0] if keras.config.image_data_format() == "channels_first" else shape[-1]
    if channels != 3:
        raise ValueError(
            f"weights={weights!r} are torchvision's network for RGB images: the input must "
            f"have 3 channels. Received: input_shape={shape}"
        )
    found = arch.describe(model)
    if found is None or found.family != "v2":
        raise ValueError(
            f"weights={weights!r} exist for ShuffleNet v2 only (torchvision's checkpoints); "
            "no ImageNet weights are published for ShuffleNet v1 in this layout. Use "
            "ShuffleNetV2 / AutoShuffleNetV2, or weights=None or a weights file. "
            f"Received: weights={weights!r}"
        )
    names = {layer.name for layer in model.layers}
    head = model.get_layer(arch.HEAD_CONV).weights[0].shape
    width = {config[3:]: w for w, config in V2_CONFIGS.items()}.get((head[-2], head[-1]))
    if found.repeats != REPEATS or width not in CHECKPOINTS:
        raise ValueError(
            f"weights={weights!r} need torchvision's ShuffleNetV2 layout: one of the widths "
            f"{sorted(CHECKPOINTS)} with stage repeats {REPEATS} (no `channels` / `repeats` "
            f"overrides). Received: repeats={found.repeats}, head {head[-2]} -> {head[-1]}"
        )
    if named is not None and named.width != width:
        # A name fixes the width: loading it into another width cannot work.
        raise ValueError(
            f"weights={weights!r} are the weights of ShuffleNetV2 width {named.width}, but "
            f"this model has width {width}. Build it with width={named.width}, or pass "
            f"weights={CHECKPOINTS[width].name!r} (or 'imagenet') for width {width}. "
            f"Received: weights={weights!r}, width={width}"
        )
    if arch.STEM_POOL not in names:
        raise ValueError(
            f"weights={weights!r} are torchvision's network, which has the ImageNet stem; "
            "stem='auto' picks the CIFAR stem when both input sides are at most 64. Build "
            f"it with stem='imagenet'. Received: weights={weights!r} with the CIFAR stem "
            f"(input shape {tuple(model.inputs[0].shape[1:])})"
        )
    entry = CHECKPOINTS[width]
    if include_top and classes != entry.classes:
        raise ValueError(
            f"With weights={weights!r} and include_top=True, `classes` must be "
            f"{entry.classes} (torchvision's ImageNet classifier). For another classifier "
            "build with include_top=False (and pooling='avg') and add your own head. "
            f"Received: classes={classes}"
        )
    return converted_weights(width, include_top, build, weights)


def learned_shuffles_in_file(path):
    """How many RelaxedShuffle entries a Keras weights file holds (`.weights.h5`, `.keras`).

    Keras names a layer's entry by its class (`layers/relaxed_shuffle_3`), with or
    without variables (relaxed or hardened). A file that is neither HDF5 nor a `.keras`
    archive raises ValueError naming it.
    """
    try:
        return _keras_internals.count_layer_entries(path, "relaxed_shuffle")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(
            "`weights` must be a Keras weights file (HDF5 `.weights.h5`, or a `.keras` "
            f"archive); {path} cannot be read as one ({type(error).__name__}: {error}). "
            f"Received: weights={path!r}"
        ) from None


def mark_padding(path, padding):
    """Records in a `.weights.h5` file the padding of the net it fits (see `file_padding`)."""
    import h5py

    with h5py.File(path, "a") as handle:
        handle.attrs[PADDING_ATTRIBUTE] = padding


def file_padding(path):
    """The padding a weights file was marked with (`mark_padding`), or None."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            value = handle.attrs.get(PADDING_ATTRIBUTE)
    except OSError:  # not HDF5 (e.g. a .keras archive): unmarked
        return None
    return value.decode() if isinstance(value, bytes) else value
