"""Figures used across the book: matplotlib, colour-blind-safe colour maps, tokens on the axes.

Alt text for a figure in a notebook goes in the cell's metadata
(``"mystnb": {"image": {"alt": "..."}}``); the website puts it on the ``<img>``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["attention_heatmap", "heads_grid", "bar_weights", "to_numpy", "memory_layout"]


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


def heads_grid(
    weights: Any,
    tokens: Sequence[str],
    *,
    title: str,
    head_titles: Sequence[str] | None = None,
    cols: int = 4,
    annotate: bool = False,
) -> Any:
    """One heatmap per head for ``weights [H, S, S]``; returns the Figure."""
    import matplotlib.pyplot as plt

    w = to_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"heads_grid expects [H, S, S] weights, got shape {w.shape}")
    H = w.shape[0]
    cols = min(cols, H)
    rows = (H + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.axis("off")
            continue
        attention_heatmap(w[h], tokens, title=head_titles[h] if head_titles else f"head {h}", ax=ax,
                          annotate=annotate, colorbar=False)
        if h % cols:
            ax.set_ylabel("")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


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


# Okabe-Ito colours (colour-blind safe), one per position in memory_layout.
_OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999"]


def memory_layout(seq_len: int = 3, num_heads: int = 2, d_k: int = 2, tokens: Sequence[str] | None = None) -> Any:
    """How one ``[S, H * D_k]`` tensor sits in memory and how three shapes read it (returns the Figure).

    The numbers ``0 .. S*H*D_k - 1`` are memory offsets; colour = the position a number belongs
    to, hatching = the head it belongs to in the correct split. Row 1 is the memory itself. Rows
    2-4 list the elements of a view in its own index order (last index fastest), each cell showing
    which memory offset it reads, with gaps between the slices of its first axis:
    ``view(S, H, D_k)`` reads the memory in order (contiguous); its ``transpose(0, 1)``,
    ``[H, S, D_k]``, reads it with jumps (same memory, not contiguous) and each head holds one
    colour per row; the bug ``view(H, S, D_k)`` reads it in order but cuts it in the wrong place,
    so a head holds several positions. Shapes and strides in the labels come from real tensors.
    """
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Rectangle

    S, H = seq_len, num_heads
    D = H * d_k
    if S > len(_OKABE_ITO):
        raise ValueError(f"memory_layout draws at most {len(_OKABE_ITO)} positions, got seq_len = {S}")
    tokens = [f"pos {s}" for s in range(S)] if tokens is None else list(tokens)
    if len(tokens) != S:
        raise ValueError(f"{len(tokens)} tokens for seq_len = {S}")
    flat = torch.arange(S * D)  # [S * D], the memory
    shd = flat.view(S, H, d_k)  # [S, H, D_k]
    hsd = shd.transpose(0, 1)  # [H, S, D_k], a view
    bug = flat.view(H, S, d_k)  # [H, S, D_k], the bug
    hatches = ["", "///", "...", "xxx", "\\\\\\", "ooo"]
    rows = [
        ("memory", flat.view(1, -1), None, "offset 0, 1, 2, ... (one after another)"),
        (f"view(S, H, D_k)  {list(shd.shape)}", shd, "position", f"strides {tuple(shd.stride())}: contiguous"),
        (f".transpose(0, 1)  {list(hsd.shape)}", hsd, "head", f"strides {tuple(hsd.stride())}: not contiguous, no copy"),
        (f"bug: view(H, S, D_k)  {list(bug.shape)}", bug, "head", f"strides {tuple(bug.stride())}: contiguous, wrong"),
    ]
    gap = 0.6
    width = S * D + gap * (max(S, H) - 1)
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.3 * len(rows) + 0.9))
    for ax, (label, t, outer, note) in zip(axes, rows):
        x = 0.0
        for i in range(t.shape[0]):
            if outer is not None:
                group = tokens[i] if outer == "position" else f"head {i}"
                n = t[i].numel()
                ax.text(x + n / 2, 1.12, group, ha="center", va="bottom", fontsize=9)
            for offset in t[i].reshape(-1).tolist():
                s, f = divmod(int(offset), D)
                ax.add_patch(Rectangle((x, 0), 1, 1, facecolor=_OKABE_ITO[s], edgecolor="black",
                                       hatch=hatches[(f // d_k) % len(hatches)], linewidth=1))
                ax.text(x + 0.5, 0.5, str(int(offset)), ha="center", va="center", fontsize=10, fontweight="bold",
                        bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.85))
                x += 1
            if outer is not None:
                x += gap
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.1, 1.6)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.set_title(f"{label}: {note}", fontsize=10, loc="left")
    fig.suptitle(f"One [S, D] = [{S}, {D}] tensor in memory and three ways to read it\n"
                 f"(cell = memory offset read; colour = position: {', '.join(tokens)}; hatching = head)", fontsize=11)
    fig.tight_layout()
    return fig
