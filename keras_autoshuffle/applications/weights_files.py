"""What a Keras weights file says about the net it fits: how many learned shuffles it
holds (`learned_shuffles_in_file`) and the padding it was marked with (`mark_padding`,
`file_padding`; torchvision's converted weights fit PyTorch's padding only)."""

import zipfile

from keras_autoshuffle import _keras_internals


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


PADDING_ATTRIBUTE = "keras_autoshuffle_padding"


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
