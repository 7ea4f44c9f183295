"""The pictures of the experiments with matplotlib: the paper's Figs. pmat, smat,
penaltyplot, roundplot; the lambda sweep and the routing counts of the Fashion-MNIST study.

Needs the `plots` extra (`pip install keras-autoshuffle[plots]`).
"""

import numpy as np

from keras_autoshuffle.permutations import permutation_matrix


def check_available():
    """Raises the ImportError of a missing matplotlib now, before hours of training."""
    _pyplot()


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


def _save(figure, path, title=None):
    if title:
        figure.suptitle(title)
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
    return _save(figure, path, title)


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
    return _save(figure, path, title)


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


def plot_lambda_sweep(rows, path, title=None):
    """Relaxed and rounded accuracy and P(M) at rounding against lambda (Table 5's shape).

    Args:
        rows: result rows with `lambda`, `relaxed_accuracy`, `rounded_accuracy`, `penalty`
            (several seeds per lambda are drawn as separate points).
    """
    pyplot = _pyplot()
    lambdas = np.asarray([r["lambda"] for r in rows], dtype=np.float64)
    positive = lambdas[lambdas > 0]
    # lambda = 0 drawn one decade left of the smallest positive lambda (log axis).
    zero_at = positive.min() / 10 if positive.size else 1e-4
    x = np.where(lambdas > 0, lambdas, zero_at)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(9, 3.5))
    left.semilogx(x, [100 * r["relaxed_accuracy"] for r in rows], "o", label="relaxed")
    left.semilogx(x, [100 * r["rounded_accuracy"] for r in rows], "s", label="rounded")
    left.set_xlabel(f"lambda (lambda = 0 drawn at {zero_at:g})")
    left.set_ylabel("test accuracy (%)")
    left.legend()
    right.loglog(x, np.maximum([r["penalty"] for r in rows], 1e-6), "o", color="C2")
    right.set_xlabel("lambda")
    right.set_ylabel("sum of P(M) at rounding")
    return _save(figure, path, title)


def plot_routing(columns, path, title=None):
    """Learned routing counts beside the manual ones: one row of panels per stage (v2) or
    shuffle (v1), one column per learned routing, the manual counts last.

    Args:
        columns: `[(heading, entries)]`, each `entries` the `hardening.routing_counts`
            entries of one net (v1: g x g block counts; v2: a stage's producer x consumer
            counts) with `counts` and `manual`, the same stages in every column.
    """
    pyplot = _pyplot()
    first = columns[0][1]
    panels = [*((heading, entries, "counts") for heading, entries in columns)]
    panels.append(("manual", first, "manual"))
    figure, axes = pyplot.subplots(
        len(first), len(panels), figsize=(4 * len(panels), 3.2 * len(first)), squeeze=False
    )
    for stage, row in enumerate(axes):
        top = max(max(int(np.max(e[stage][k])) for _, e, k in panels), 1)
        for axis, (heading, entries, key) in zip(row, panels, strict=True):
            entry = entries[stage]
            label = entry.get("name") or f"stage {entry['stage']}"
            counts = np.asarray(entry[key])
            axis.imshow(counts, cmap="viridis", vmin=0, vmax=top)
            for (i, j), value in np.ndenumerate(counts):
                axis.text(j, i, str(value), ha="center", va="center", color="w", fontsize=7)
            axis.set_title(f"{label}: {heading}", fontsize=9)
            if "producers" in entry:
                axis.set_yticks(
                    range(len(entry["producers"])), [str(p) for p in entry["producers"]]
                )
                axis.set_xticks(
                    range(len(entry["consumers"])), [str(c) for c in entry["consumers"]]
                )
                axis.set_ylabel("producer (unit branch)")
                axis.set_xlabel("consumer (unit branch, end)")
            else:
                axis.set_yticks(range(counts.shape[0]))
                axis.set_xticks(range(counts.shape[1]))
                axis.set_ylabel("source group")
                axis.set_xlabel("target group")
    return _save(figure, path, title)
