"""Figures used across the book: matplotlib, colour-blind-safe colour maps, tokens on the axes.

Alt text for a figure in a notebook goes in the cell's metadata
(``"mystnb": {"image": {"alt": "..."}}``); the website puts it on the ``<img>``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["attention_heatmap", "bar_weights", "to_numpy"]


def to_numpy(x: Any) -> np.ndarray:
    """A tensor or array-like as a float NumPy array (detached, on the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=float)


def attention_heatmap(
    weights: Any,
    row_labels: Sequence[str],
    col_labels: Sequence[str] | None = None,
    *,
    title: str,
    ax: Any = None,
    annotate: bool = True,
    cmap: str = "viridis",
    vmin: float = 0.0,
    vmax: float | None = 1.0,
    colorbar: bool = True,
    fmt: str = "{:.2f}",
) -> Any:
    """Draw ``weights [S_q, S_k]`` as a heatmap with query tokens down and key tokens across.

    Args:
        weights: ``[S_q, S_k]`` tensor or array (masked entries may be 0 or NaN).
        row_labels: ``S_q`` tokens that look (queries).
        col_labels: ``S_k`` tokens looked at (keys); default ``row_labels``.
        title: the figure's title.
        ax: an existing matplotlib Axes, or None for a new figure.
        annotate: write each number in its cell.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap expects [S_q, S_k] weights, got shape {w.shape}")
    col_labels = row_labels if col_labels is None else col_labels
    if len(row_labels) != w.shape[0] or len(col_labels) != w.shape[1]:
        raise ValueError(
            f"{len(row_labels)} row labels and {len(col_labels)} column labels do not match weights of shape {w.shape}"
        )
    if ax is None:
        size = max(3.0, 0.5 * w.shape[1] + 1.5)
        _, ax = plt.subplots(figsize=(size + (1.0 if colorbar else 0.0), max(2.5, 0.45 * w.shape[0] + 1.2)))
    image = ax.imshow(w, cmap=cmap, vmin=vmin, vmax=vmax if vmax is not None else np.nanmax(w), aspect="auto")
    ax.set_xticks(range(w.shape[1]), labels=list(col_labels), rotation=45, ha="right")
    ax.set_yticks(range(w.shape[0]), labels=list(row_labels))
    ax.set_xlabel("key (looked at)")
    ax.set_ylabel("query (looking)")
    ax.set_title(title)
    if annotate and w.size <= 400:
        lo, hi = image.get_clim()
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                if np.isfinite(w[i, j]):
                    t = 0.5 if hi <= lo else (w[i, j] - lo) / (hi - lo)
                    ax.text(j, i, fmt.format(w[i, j]), ha="center", va="center", fontsize=8,
                            color="black" if t > 0.6 else "white")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def bar_weights(weights: Any, tokens: Sequence[str], *, title: str, ax: Any = None, highlight: Sequence[int] = ()) -> Any:
    """Bar chart of one query's weights ``[S_k]`` over the key tokens; returns the Axes."""
    import matplotlib.pyplot as plt

    w = to_numpy(weights)
    if w.ndim != 1 or len(tokens) != w.shape[0]:
        raise ValueError(f"bar_weights expects [S_k] weights matching {len(tokens)} tokens, got shape {w.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(tokens) + 1), 2.8))
    colours = ["#E69F00" if i in set(highlight) else "#0072B2" for i in range(len(tokens))]  # Okabe-Ito
    ax.bar(range(len(tokens)), w, color=colours)
    ax.set_xticks(range(len(tokens)), labels=list(tokens), rotation=45, ha="right")
    ax.set_ylabel("weight")
    ax.set_ylim(0, max(1.0, float(w.max()) * 1.1))
    ax.set_title(title)
    for i, value in enumerate(w):
        ax.text(i, value + 0.01, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    return ax
