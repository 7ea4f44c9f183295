"""The paper's pictures with matplotlib (Figs. pmat, smat, penaltyplot, roundplot).

Needs the `plots` extra (`pip install keras-autoshuffle[plots]`).
"""

import numpy as np

from keras_autoshuffle.permutations import permutation_matrix


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "Plots need matplotlib: pip install 'keras-autoshuffle[plots]'"
        ) from error
    matplotlib.use("Agg")  # files only; no display on training machines
    from matplotlib import pyplot

    return pyplot


def _save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return str(path)


def plot_matrices(matrices, path, title=None):
    """Shows square matrices side by side (dict label -> matrix or permutation vector).

    A 1-D entry is drawn as its permutation matrix. Used for Fig. pmat (learned
    vs manual permutation) and Fig. smat (relaxed matrices at two lambdas).
    """
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(1, len(matrices), figsize=(4 * len(matrices), 4), squeeze=False)
    for axis, (label, matrix) in zip(axes[0], matrices.items(), strict=True):
        matrix = np.asarray(matrix)
        if matrix.ndim == 1:
            matrix = permutation_matrix(matrix)
        image = axis.imshow(matrix, cmap="viridis", vmin=0.0, vmax=max(1e-9, float(matrix.max())))
        axis.set_title(label)
        axis.set_xlabel("input channel j")
        axis.set_ylabel("output channel i")
        figure.colorbar(image, ax=axis, fraction=0.046)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_penalty(history, path, title=None):
    """Training loss and shuffle penalty per epoch (Fig. penaltyplot).

    Args:
        history: a dict like `History.history` with `loss` and `l12_penalty`.
    """
    pyplot = _pyplot()
    epochs = np.arange(1, len(history["loss"]) + 1)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, history["loss"], marker="o")
    left.set_xlabel("epoch")
    left.set_ylabel("training loss")
    right.semilogy(epochs, np.maximum(history["l12_penalty"], 1e-12), marker="o", color="C1")
    right.set_xlabel("epoch")
    right.set_ylabel("sum of P(M) (log scale)")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_rounding(history, path, title=None):
    """Relaxed vs rounded validation accuracy per epoch (Fig. roundplot).

    Args:
        history: a dict with `val_relaxed_accuracy` and `val_rounded_accuracy`
            (as logged by `RoundingMonitor`).
    """
    pyplot = _pyplot()
    epochs = np.arange(1, len(history["val_relaxed_accuracy"]) + 1)
    figure, axis = pyplot.subplots(figsize=(5, 3.5))
    axis.plot(epochs, history["val_relaxed_accuracy"], marker="o", label="relaxed")
    axis.plot(epochs, history["val_rounded_accuracy"], marker="s", label="rounded")
    axis.set_xlabel("epoch")
    axis.set_ylabel("validation accuracy")
    axis.set_ylim(0, 1)
    axis.legend()
    if title:
        axis.set_title(title)
    return _save(figure, path)
