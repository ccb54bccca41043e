"""Figures used across the book: matplotlib, colour-blind-safe colour maps, tokens on the axes.

Alt text for a figure in a notebook goes in the cell's metadata
(``"mystnb": {"image": {"alt": "..."}}``); the website puts it on the ``<img>``.

Every PNG a figure is rendered to while attnbook is imported in IPython (the notebook's inline
figures) carries, in a tEXt chunk :data:`TEXT_KEY`, the size in CSS px of its smallest drawn text
when the website shows it on a 390 px phone: the image is shown at its own CSS width (its pixels at
the figure's dpi, so a retina PNG counts half) or the column's :data:`PHONE_WIDTH`, whichever is
smaller. ``tests/test_figure_text.py`` fails when a stored figure has none or one under
:data:`MIN_TEXT_PX` (11 px, the diagrams' rule).
"""

from __future__ import annotations

import struct
import zlib
from io import BytesIO
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .diagrams import MIN_TEXT_PX, PHONE_WIDTH

__all__ = ["attention_heatmap", "bar_weights", "to_numpy", "TEXT_KEY", "MIN_TEXT_PX", "PHONE_WIDTH",
           "png_min_text_px", "install_png_text_size", "text_size_png", "use_book_style",
           "BOOK_RC", "PHONE_FIGURE_INCHES", "ANNOTATION_PT"]

#: The book's matplotlib settings (:func:`use_book_style`): 12 pt text keeps 11 px on a phone in a
#: figure up to 5.4 inches wide (a figure W inches wide needs text of at least 2.2 W pt).
BOOK_RC = {"font.size": 12.0, "figure.figsize": (5.2, 3.9)}
#: The widest figure (inches, as drawn) whose 12 pt text stays 11 px on a phone, with a margin.
PHONE_FIGURE_INCHES = 5.2
#: Numbers written in heatmap cells and above bars.
ANNOTATION_PT = 11.5

#: The PNG tEXt key that holds the smallest text's size in CSS px on a 390 px phone ("none": no text).
TEXT_KEY = "attnbook:min-text-px-390"


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
        # narrow enough for a phone (PHONE_FIGURE_INCHES): the cells shrink before the text does
        # (the tick labels and the axis label stick out of the figure by about 0.4 inches)
        size = min(max(3.0, 0.5 * w.shape[1] + 1.5), PHONE_FIGURE_INCHES - (1.3 if colorbar else 0.4))
        _, ax = plt.subplots(figsize=(size + (0.9 if colorbar else 0.0), max(2.5, 0.45 * w.shape[0] + 1.2)))
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
                    ax.text(j, i, fmt.format(w[i, j]), ha="center", va="center", fontsize=ANNOTATION_PT,
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
        _, ax = plt.subplots(figsize=(min(PHONE_FIGURE_INCHES, max(4.0, 0.6 * len(tokens) + 1)), 3.2))
    colours = ["#E69F00" if i in set(highlight) else "#0072B2" for i in range(len(tokens))]  # Okabe-Ito
    ax.bar(range(len(tokens)), w, color=colours)
    ax.set_xticks(range(len(tokens)), labels=list(tokens), rotation=45, ha="right")
    ax.set_ylabel("weight")
    # more than 8 bars in a phone-wide figure: the numbers stand upright above the bars
    upright = len(tokens) > 8
    ax.set_ylim(0, max(1.0, float(w.max())) * (1.3 if upright else 1.1))
    ax.set_title(title)
    for i, value in enumerate(w):
        ax.text(i, value + 0.02, f"{value:.2f}", ha="center", va="bottom", fontsize=ANNOTATION_PT,
                rotation=90 if upright else 0)
    return ax


# ---- the smallest text of a rendered figure, written into its PNG ------------------------------


def _png_chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """``(type, data)`` of every chunk of a PNG file."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    chunks, pos = [], 8
    while pos + 8 <= len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        chunks.append((png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return chunks


def png_text(png: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG file as a dict."""
    out = {}
    for kind, data in _png_chunks(png):
        if kind == b"tEXt" and b"\x00" in data:
            key, value = data.split(b"\x00", 1)
            out[key.decode("latin-1")] = value.decode("latin-1")
    return out


def png_min_text_px(png: bytes) -> float | None:
    """The smallest text of a figure's PNG in CSS px on a 390 px phone, from its :data:`TEXT_KEY`.

    ``None`` when the PNG has no such chunk; ``inf`` when the figure drew no text.
    """
    value = png_text(png).get(TEXT_KEY)
    if value is None:
        return None
    return float("inf") if value == "none" else float(value)


def _with_text(png: bytes, key: str, value: str) -> bytes:
    """The PNG with a tEXt chunk ``key: value`` put just before its IEND chunk."""
    end = png.rindex(b"IEND") - 4
    data = key.encode("latin-1") + b"\x00" + value.encode("latin-1")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:end] + chunk + png[end:]


def text_size_png(png_px: Sequence[float], png_width: int, fig_dpi: float, dpi: float) -> float:
    """The smallest of texts ``png_px`` (px of a PNG ``png_width`` px wide, drawn at ``dpi``) in CSS px on a phone.

    The notebook and the website show a figure at its own dpi (the inline backend's retina PNG,
    drawn at twice the figure's dpi, is shown at half its pixel width), so its CSS width is
    ``png_width * fig_dpi / dpi``; on a 390 px phone it is shown at most :data:`PHONE_WIDTH` wide.

    >>> round(text_size_png([10 * 100 / 72], 716, 100, 100), 2)   # 10 pt text, a 7.16 inch figure
    6.94
    >>> text_size_png([20.0], 300, 100, 200)   # retina: 300 px shown 150 px wide, text 20 px -> 10
    10.0
    """
    css_width = png_width * fig_dpi / dpi
    shown = min(css_width, PHONE_WIDTH)
    return min(png_px) * shown / png_width


def use_book_style() -> None:
    """Apply :data:`BOOK_RC` to matplotlib (done when attnbook is imported in IPython)."""
    import matplotlib

    matplotlib.rcParams.update(BOOK_RC)


_INSTALLED = False


def install_png_text_size() -> None:
    """Make every PNG that matplotlib renders carry :data:`TEXT_KEY` (idempotent).

    Wraps ``FigureCanvasBase.print_figure``, which IPython's inline figures (and ``savefig``) go
    through: while a PNG is drawn, the Agg renderer records the size of every text it draws (tick
    labels, titles, labels, annotations, legends, colour bars; only what is drawn, after
    ``bbox_inches="tight"``), and the result goes into the PNG as a tEXt chunk.
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import RendererAgg

    original = FigureCanvasBase.print_figure
    draw_text, draw_tex = RendererAgg.draw_text, RendererAgg.draw_tex

    def print_figure(self: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        fmt = kwargs.get("format")
        if fmt is None and isinstance(filename, (str, Path)):
            fmt = Path(filename).suffix.lstrip(".") or None
        if (fmt or "png").lower() != "png" or args:
            return original(self, filename, *args, **kwargs)
        kwargs = {**kwargs, "format": "png"}
        fig_dpi = float(self.figure.dpi)
        drawn: list[tuple[float, float]] = []  # (text size in PNG px, renderer dpi)

        def record(renderer: Any, s: str, prop: Any) -> None:
            if str(s).strip():
                drawn.append((prop.get_size_in_points() * renderer.dpi / 72.0, float(renderer.dpi)))

        def text(renderer, gc, x, y, s, prop, angle, ismath=False, mtext=None):  # noqa: ANN001, ANN202
            record(renderer, s, prop)
            return draw_text(renderer, gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

        def tex(renderer, gc, x, y, s, prop, angle, *, mtext=None):  # noqa: ANN001, ANN202
            record(renderer, s, prop)
            return draw_tex(renderer, gc, x, y, s, prop, angle, mtext=mtext)

        buffer = BytesIO()
        RendererAgg.draw_text, RendererAgg.draw_tex = text, tex
        try:
            result = original(self, buffer, **kwargs)
        finally:
            RendererAgg.draw_text, RendererAgg.draw_tex = draw_text, draw_tex
        png = buffer.getvalue()
        if drawn:
            (width,) = struct.unpack(">I", png[16:20])
            value = f"{text_size_png([px for px, _ in drawn], width, fig_dpi, drawn[-1][1]):.1f}"
        else:
            value = "none"
        png = _with_text(png, TEXT_KEY, value)
        if hasattr(filename, "write"):
            filename.write(png)
        else:
            Path(filename).write_bytes(png)
        return result

    FigureCanvasBase.print_figure = print_figure
    _INSTALLED = True
