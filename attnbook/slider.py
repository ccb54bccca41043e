"""Sliders in two forms.

* :func:`live_slider`: ipywidgets, redraws with a running kernel (JupyterLab, Colab).
* :func:`static_slider`: kernel-free. Every slider position is computed in Python ahead of
  time and rendered as an HTML heatmap; a few lines of inline JavaScript only show the frame the
  slider points at. It needs no kernel and no network, so it works on the static website.

The numbers shown in a static slider are real outputs of the notebook (and nbval compares them).
"""

from __future__ import annotations

import functools
import hashlib
import html
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from IPython.display import HTML

__all__ = ["Panel", "Frame", "frame_html", "static_slider", "live_slider", "redraw_ms"]


@dataclass
class Panel:
    """One heatmap inside a frame.

    Attributes:
        matrix: ``[R, C]`` numbers (a 1-D array is shown as one row).
        row_labels: ``R`` labels (tokens looking), or ``None``.
        col_labels: ``C`` labels (tokens looked at), or ``None``.
        title: shown above the heatmap.
        vmin, vmax: colour range; ``None`` means the matrix's own min/max.
        masked: optional bool ``[R, C]``; True cells are drawn as hidden (hatched grey, no number).
    """

    matrix: Any
    row_labels: Sequence[str] | None = None
    col_labels: Sequence[str] | None = None
    title: str = ""
    vmin: float | None = None
    vmax: float | None = None
    masked: Any = None


@dataclass
class Frame:
    """What the page shows for one slider position."""

    label: str
    panels: list[Panel]
    caption: str = ""


@functools.lru_cache(maxsize=None)
def _colormap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]  # a fresh copy on every lookup (slow to initialise), so keep one


def _colour(value: float, vmin: float, vmax: float, cmap: str) -> tuple[str, str]:
    t = 0.5 if vmax <= vmin else (value - vmin) / (vmax - vmin)
    r, g, b, _ = _colormap(cmap)(float(np.clip(t, 0.0, 1.0)))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}", ("#000" if luminance > 0.5 else "#fff")


def _panel_html(p: Panel, fmt: str, cmap: str) -> str:
    m = np.asarray(p.matrix, dtype=float)
    if m.ndim == 1:
        m = m[None, :]
    masked = np.zeros(m.shape, dtype=bool) if p.masked is None else np.asarray(p.masked, dtype=bool).reshape(m.shape)
    visible = m[~masked & np.isfinite(m)]
    vmin = p.vmin if p.vmin is not None else (float(visible.min()) if visible.size else 0.0)
    vmax = p.vmax if p.vmax is not None else (float(visible.max()) if visible.size else 1.0)
    rows = []
    if p.col_labels is not None:
        head = "".join(f'<th scope="col" style="padding:2px 4px;font-weight:normal">{html.escape(str(c))}</th>' for c in p.col_labels)
        rows.append(f"<tr><th></th>{head}</tr>")
    for i in range(m.shape[0]):
        cells = []
        if p.row_labels is not None:
            cells.append(f'<th scope="row" style="padding:2px 6px;text-align:right;font-weight:normal">{html.escape(str(p.row_labels[i]))}</th>')
        for j in range(m.shape[1]):
            if masked[i, j] or not np.isfinite(m[i, j]):
                cells.append('<td class="attnlib-masked" title="masked" style="background:repeating-linear-gradient(45deg,#ddd,#ddd 3px,#bbb 3px,#bbb 6px);min-width:3em"></td>')
            else:
                bg, fg = _colour(m[i, j], vmin, vmax, cmap)
                cells.append(
                    f'<td style="background:{bg};color:{fg};padding:2px 6px;text-align:center;min-width:3em">{fmt.format(m[i, j])}</td>'
                )
        rows.append("<tr>" + "".join(cells) + "</tr>")
    title = f'<div style="font-weight:bold;margin:4px 0">{html.escape(p.title)}</div>' if p.title else ""
    return (
        f'<div style="display:inline-block;vertical-align:top;margin:0 12px 8px 0">{title}'
        f'<table class="attnlib-heatmap" style="border-collapse:collapse;font-size:12px">{"".join(rows)}</table></div>'
    )


def _frame_body(frame: Frame, fmt: str, cmap: str) -> str:
    """A frame's caption followed by its heatmaps (shared by the live and the kernel-free form)."""
    panels = "".join(_panel_html(p, fmt, cmap) for p in frame.panels)
    caption = f'<div class="attnlib-caption" style="margin:4px 0">{html.escape(frame.caption)}</div>' if frame.caption else ""
    return caption + panels


def frame_html(frame: Frame, *, fmt: str = "{:.2f}", cmap: str = "viridis") -> HTML:
    """One :class:`Frame` (its caption and heatmaps) as HTML, with no slider around it.

    A live slider's ``draw`` can display this instead of a matplotlib figure: an HTML table
    redraws far faster than a figure is rendered to PNG, and the live slider then looks exactly
    like its kernel-free twin built by :func:`static_slider` from the same frames.
    """
    return HTML(f'<div class="attnlib-frame">{_frame_body(frame, fmt, cmap)}</div>')


def static_slider(
    frame: Callable[..., Frame],
    settings: Iterable[Mapping[str, Any]],
    *,
    slider_label: str,
    title: str,
    alt: str,
    initial: int = 0,
    fmt: str = "{:.2f}",
    cmap: str = "viridis",
) -> HTML:
    """A kernel-free slider: ``frame(**setting)`` for each setting, precomputed, one per position.

    The same ``frame`` function drives :func:`live_slider`, so the website shows exactly what a
    running kernel would draw for those settings.

    Args:
        frame: returns the :class:`Frame` to show for one setting, e.g. ``frame(temperature=0.5)``.
        settings: the keyword arguments of ``frame`` at each slider position, in slider order.
        slider_label: what the slider controls, e.g. ``"temperature T"``.
        title: heading shown above the slider.
        alt: a text description of the figure for screen readers.
        initial: index of the setting shown first.
        fmt: format for the numbers in the cells.
        cmap: a matplotlib colour map (default viridis, which is colour-blind safe).

    Returns:
        An ``IPython.display.HTML`` object; display it (or make it a cell's last expression).
    """
    frames = [frame(**dict(s)) for s in settings]
    if not frames:
        raise ValueError("static_slider needs at least one setting")
    if not 0 <= initial < len(frames):
        raise ValueError(f"initial = {initial} is out of range for {len(frames)} settings")
    bodies = []
    for i, f in enumerate(frames):
        hidden = "" if i == initial else ' style="display:none"'
        bodies.append(f'<div class="attnlib-frame" data-index="{i}"{hidden}>{_frame_body(f, fmt, cmap)}</div>')
    body = "".join(bodies)
    uid = "attnlib-slider-" + hashlib.sha1((title + slider_label + body).encode()).hexdigest()[:10]
    labels = [html.escape(f.label) for f in frames]
    label_json = "[" + ",".join('"' + lab.replace('"', "&quot;") + '"' for lab in labels) + "]"
    script = (
        "<script>(function(){"
        f'var root=document.getElementById("{uid}");if(!root)return;'
        'var input=root.querySelector("input[type=range]");var out=root.querySelector(".attnlib-value");'
        f"var labels={label_json};"
        'function show(){var k=Number(input.value);root.querySelectorAll(".attnlib-frame").forEach(function(f){'
        'f.style.display=(Number(f.dataset.index)===k)?"":"none";});out.textContent=labels[k];}'
        'input.addEventListener("input",show);show();})();</script>'
    )
    markup = (
        f'<div id="{uid}" class="attnlib-slider" role="figure" aria-label="{html.escape(alt)}">'
        f'<div style="font-weight:bold;font-size:1.05em">{html.escape(title)}</div>'
        f'<label style="display:block;margin:6px 0">{html.escape(slider_label)}: '
        f'<input type="range" min="0" max="{len(frames) - 1}" step="1" value="{initial}" '
        f'aria-label="{html.escape(slider_label)}" style="vertical-align:middle;width:16em"> '
        f'<output class="attnlib-value">{labels[initial]}</output></label>'
        f"{body}{script}</div>"
    )
    return HTML(markup)


def live_slider(frame: Callable[..., Frame], **controls: Any) -> Any:
    """Show ``frame(**values)`` under ipywidgets controls, redrawn whenever a control moves.

    ``controls`` are what ``ipywidgets.interactive`` accepts, e.g.
    ``temperature=ipywidgets.FloatLogSlider(value=1, base=10, min=-1, max=1)``.
    Needs a running kernel; on the static website use :func:`static_slider` with the same
    ``frame``. In the book, tag the cell ``remove-output`` and ``nbval-ignore-output``.

    Returns:
        The ``ipywidgets.interactive`` widget (already displayed).
    """
    import ipywidgets
    from IPython.display import display

    def draw(**values: Any) -> None:
        display(frame_html(frame(**values)))

    widget = ipywidgets.interactive(draw, **controls)
    display(widget)
    return widget


def redraw_ms(frame: Callable[..., Frame], settings: Iterable[Mapping[str, Any]]) -> list[float]:
    """Wall time, in milliseconds, of one live redraw (``frame(**s)`` rendered to HTML) per setting.

    This is a measurement (print it with the book's ``~``); the book aims for < 100 ms.
    """
    times = []
    for s in settings:
        start = time.perf_counter()
        frame_html(frame(**dict(s)))
        times.append((time.perf_counter() - start) * 1000.0)
    return times
