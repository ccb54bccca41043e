"""Sliders in two forms.

* :func:`live_slider`: ipywidgets, redraws with a running kernel (JupyterLab, Colab).
* :func:`static_slider`: kernel-free. Every slider position is computed in Python ahead of
  time; the numbers of each frame are stored once as JSON data, and a few lines of inline
  JavaScript draw the heatmaps of the frame the slider points at. It needs no kernel and no
  network, so it works on the static website.

Both draw the same HTML: a table per heatmap, each cell's background from the colour map and its
text black or white, whichever contrasts more (always at least 4.58:1, WCAG AA asks 4.5:1).
The numbers shown in a static slider are real outputs of the notebook (and nbval compares them).
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import html
import inspect
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from IPython.display import HTML

__all__ = ["Panel", "Frame", "frame_html", "frame_setting", "static_slider", "live_slider", "redraw_ms", "contrast_ratio",
           "LIVE_NOTE"]


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
        style: ``"heatmap"`` (a table of coloured cells) or ``"lines"`` (a line view: rows on the
            left, columns on the right, one line per cell with opacity = its value in ``[0, 1]``,
            lines below 0.01 left out; for attention weights ``[S_q, S_k]``, as in BertViz).
    """

    matrix: Any
    row_labels: Sequence[str] | None = None
    col_labels: Sequence[str] | None = None
    title: str = ""
    vmin: float | None = None
    vmax: float | None = None
    masked: Any = None
    style: str = "heatmap"


@dataclass
class Frame:
    """What the page shows for one slider position."""

    label: str
    panels: list[Panel]
    caption: str = ""


def _luminance(rgb: Sequence[float]) -> float:
    """WCAG 2.1 relative luminance of an sRGB colour with channels in [0, 1]."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """WCAG 2.1 contrast ratio of two sRGB colours (channels in [0, 1]): 1 (none) to 21.

    >>> round(contrast_ratio((0, 0, 0), (1, 1, 1)), 1)
    21.0
    """
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@functools.lru_cache(maxsize=None)
def palette(cmap: str) -> tuple[tuple[str, str], ...]:
    """The colour map's own lookup table as ``(background, text)`` hex pairs.

    The text is black or white, whichever contrasts more with the background; one of the two
    always reaches sqrt(21) = 4.58:1, since their ratios multiply to 21.
    """
    import matplotlib

    lut = matplotlib.colormaps[cmap]
    pairs = []
    for r, g, b, _ in lut(np.arange(lut.N)):
        black = contrast_ratio((r, g, b), (0, 0, 0)) >= contrast_ratio((r, g, b), (1, 1, 1))
        pairs.append((f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}", "#000" if black else "#fff"))
    return tuple(pairs)


def _indices(m: np.ndarray, vmin: float, vmax: float, n: int) -> np.ndarray:
    """Each value's entry in an ``n``-colour table, as matplotlib's ``cmap(t)`` picks it."""
    t = np.full(m.shape, 0.5) if vmax <= vmin else (m - vmin) / (vmax - vmin)
    return np.minimum((np.clip(np.nan_to_num(t), 0.0, 1.0) * n).astype(int), n - 1)


def _lines_data(p: Panel, m: np.ndarray) -> dict[str, Any]:
    """A line-view panel as data: labels, each line's opacity ('' = not drawn) and a text alternative."""
    if p.style != "lines":
        raise ValueError(f"Panel style must be 'heatmap' or 'lines', got {p.style!r}")
    R, C = m.shape
    rows = [str(x) for x in (p.row_labels if p.row_labels is not None else range(R))]
    cols = [str(x) for x in (p.col_labels if p.col_labels is not None else range(C))]
    strongest = "; ".join(f"{rows[i]} to {cols[int(np.nanargmax(m[i]))]} {float(np.nanmax(m[i])):.2f}" for i in range(R))
    return {"y": "lines", "t": p.title, "r": rows, "k": cols, "w": C, "i": [],
            "v": [f"{x:.3f}" if np.isfinite(x) and x >= 0.01 else "" for x in m.flat],
            "d": "Line view: each row on the left is joined to each column on the right, darker lines carry "
                 "more weight. Strongest of each row: " + strongest}


def _panel_data(p: Panel, fmt: str, n: int) -> dict[str, Any]:
    """A panel as data: labels, the formatted cell texts and each cell's colour index (-1: masked).

    The colour index is taken from the formatted value, not from the float behind it.
    """
    m = np.asarray(p.matrix, dtype=float)
    if m.ndim == 1:
        m = m[None, :]
    if p.style != "heatmap":
        return _lines_data(p, m)
    masked = np.zeros(m.shape, dtype=bool) if p.masked is None else np.asarray(p.masked, dtype=bool).reshape(m.shape)
    masked = masked | ~np.isfinite(m)
    # Each cell is coloured by the number it prints, so cells that print the same number share a
    # colour, and a float's last bits (which differ from one CPU to another) cannot change a colour
    # without changing the number shown.
    shown = np.array([float(fmt.format(x)) if ok else 0.0 for x, ok in zip(m.flat, (~masked).flat)]).reshape(m.shape)
    visible = shown[~masked]
    vmin = p.vmin if p.vmin is not None else (float(visible.min()) if visible.size else 0.0)
    vmax = p.vmax if p.vmax is not None else (float(visible.max()) if visible.size else 1.0)
    idx = np.where(masked, -1, _indices(shown, vmin, vmax, n))
    return {
        "t": p.title,
        "r": None if p.row_labels is None else [str(x) for x in p.row_labels],
        "k": None if p.col_labels is None else [str(x) for x in p.col_labels],
        "w": m.shape[1],
        "v": ["" if masked.flat[i] else fmt.format(m.flat[i]) for i in range(m.size)],
        "i": [int(x) for x in idx.flat],
    }


def _frame_data(frame: Frame, fmt: str, n: int) -> dict[str, Any]:
    return {"l": frame.label, "c": frame.caption, "p": [_panel_data(p, fmt, n) for p in frame.panels]}


# The markup of one frame, written once in Python (frame_html, the first frame of a static slider)
# and once in JavaScript (_RENDER_JS, the other frames); tests/test_attnbook.py and the site tests
# check that both give the same HTML.
_HIDDEN = "position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap"
_MASKED = "background:repeating-linear-gradient(45deg,#ddd,#ddd 3px,#bbb 3px,#bbb 6px);min-width:3em"
#: The style every heatmap cell shares, written once per output instead of once per cell.
_CELL_STYLE = "<style>table.attnlib-heatmap td{padding:2px 6px;text-align:center;min-width:3em}</style>"
_HEAD = "padding:2px 4px;font-weight:normal"
_ROW_HEAD = "padding:2px 6px;text-align:right;font-weight:normal"
_CORNER = f'<td><span style="{_HIDDEN}">row \\ column</span></td>'


def _frame_markup(data: dict[str, Any], pal: Sequence[tuple[str, str]]) -> str:
    esc = html.escape
    out = [f'<div class="attnlib-caption" style="margin:4px 0">{esc(data["c"])}</div>' if data["c"] else ""]
    for p in data["p"]:
        if p.get("y") == "lines":
            out.append(_lines_markup(p))
            continue
        rows = []
        if p["k"] is not None:
            corner = _CORNER if p["r"] is not None else ""
            rows.append("<tr>" + corner + "".join(f'<th scope="col" style="{_HEAD}">{esc(c)}</th>' for c in p["k"]) + "</tr>")
        for i in range(len(p["v"]) // p["w"]):
            cells = [f'<th scope="row" style="{_ROW_HEAD}">{esc(p["r"][i])}</th>'] if p["r"] is not None else []
            for j in range(i * p["w"], (i + 1) * p["w"]):
                k = p["i"][j]
                if k < 0:
                    cells.append(f'<td class="attnlib-masked" style="{_MASKED}"><span style="{_HIDDEN}">masked</span></td>')
                else:
                    cells.append(f'<td style="background:{pal[k][0]};color:{pal[k][1]}">{esc(p["v"][j])}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        title = f'<div style="font-weight:bold;margin:4px 0">{esc(p["t"])}</div>' if p["t"] else ""
        out.append(f'<div style="display:inline-block;vertical-align:top;margin:0 12px 8px 0">{title}'
                   f'<table class="attnlib-heatmap" style="border-collapse:collapse;font-size:12px">{"".join(rows)}</table></div>')
    return "".join(out)


def _lines_markup(p: dict[str, Any]) -> str:
    """The SVG of a line-view panel (integer coordinates, so the JavaScript twin writes the same text)."""
    esc = html.escape
    S, C = len(p["r"]), p["w"]
    height = 36 + 22 * max(S, C)
    lines = "".join(f'<line x1="110" y1="{41 + 22 * (j // C)}" x2="250" y2="{41 + 22 * (j % C)}" stroke-opacity="{o}"/>'
                    for j, o in enumerate(p["v"]) if o)
    left = "".join(f'<text x="102" y="{46 + 22 * i}" text-anchor="end">{esc(t)}</text>' for i, t in enumerate(p["r"]))
    right = "".join(f'<text x="258" y="{46 + 22 * i}">{esc(t)}</text>' for i, t in enumerate(p["k"]))
    title = f'<div style="font-weight:bold;margin:4px 0">{esc(p["t"])}</div>' if p["t"] else ""
    return (f'<div style="display:inline-block;vertical-align:top;margin:0 12px 8px 0">{title}'
            f'<svg class="attnlib-lines" role="img" aria-label="{esc(p["t"] + ". " + p["d"])}" viewBox="0 0 360 {height}" '
            f'style="max-width:360px;width:100%;height:auto;font-family:sans-serif">'
            f'<g stroke="#0072B2" stroke-width="3">{lines}</g><g font-size="14" fill="currentColor">{left}{right}</g></svg></div>')


# Draws frame k of the JSON data into the frame box; the same markup as _frame_markup.
_RENDER_JS = (
    "function(d,k){var S=d.s,P=d.pal,f=d.f[k],o=[];"
    "function e(x){return String(x).replace(/&/g,'&amp;').replace(/</g,'&lt;').replace(/>/g,'&gt;')"
    ".replace(/\"/g,'&quot;').replace(/'/g,'&#x27;');}"
    "o.push(f.c?'<div class=\"attnlib-caption\" style=\"margin:4px 0\">'+e(f.c)+'</div>':'');"
    "function L(p){var S=p.r.length,C=p.w,a=[],b=[],j;"
    "p.v.forEach(function(o,j){if(o)a.push('<line x1=\"110\" y1=\"'+(41+22*Math.floor(j/C))+'\" x2=\"250\" y2=\"'+(41+22*(j%C))+'\" stroke-opacity=\"'+o+'\"/>');});"
    "p.r.forEach(function(t,i){b.push('<text x=\"102\" y=\"'+(46+22*i)+'\" text-anchor=\"end\">'+e(t)+'</text>');});"
    "p.k.forEach(function(t,i){b.push('<text x=\"258\" y=\"'+(46+22*i)+'\">'+e(t)+'</text>');});"
    "return '<div style=\"display:inline-block;vertical-align:top;margin:0 12px 8px 0\">'+(p.t?'<div style=\"font-weight:bold;margin:4px 0\">'+e(p.t)+'</div>':'')"
    "+'<svg class=\"attnlib-lines\" role=\"img\" aria-label=\"'+e(p.t+'. '+p.d)+'\" viewBox=\"0 0 360 '+(36+22*Math.max(S,C))+'\" '"
    "+'style=\"max-width:360px;width:100%;height:auto;font-family:sans-serif\">'"
    "+'<g stroke=\"#0072B2\" stroke-width=\"3\">'+a.join('')+'</g><g font-size=\"14\" fill=\"currentColor\">'+b.join('')+'</g></svg></div>';}"
    "f.p.forEach(function(p){if(p.y==='lines'){o.push(L(p));return;}var r=[],i,j,h;"
    "if(p.k){r.push('<tr>'+(p.r?S.corner:'')+p.k.map(function(c){return '<th scope=\"col\" style=\"'+S.head+'\">'+e(c)+'</th>';}).join('')+'</tr>');}"
    "for(i=0;i<p.v.length/p.w;i++){h=p.r?['<th scope=\"row\" style=\"'+S.rowhead+'\">'+e(p.r[i])+'</th>']:[];"
    "for(j=i*p.w;j<(i+1)*p.w;j++){var c=p.i[j];h.push(c<0?'<td class=\"attnlib-masked\" style=\"'+S.masked+'\"><span style=\"'+S.hidden+'\">masked</span></td>'"
    ":'<td style=\"background:'+P[c][0]+';color:'+P[c][1]+'\">'+e(p.v[j])+'</td>');}"
    "r.push('<tr>'+h.join('')+'</tr>');}"
    "o.push('<div style=\"display:inline-block;vertical-align:top;margin:0 12px 8px 0\">'+(p.t?'<div style=\"font-weight:bold;margin:4px 0\">'+e(p.t)+'</div>':'')"
    "+'<table class=\"attnlib-heatmap\" style=\"border-collapse:collapse;font-size:12px\">'+r.join('')+'</table></div>');});"
    "return o.join('');}"
)

#: The line view's part of the renderer, left out of a slider that has no line-view panel (it
#: would be about 1 KB of script per slider that never runs).
_LINES_JS = _RENDER_JS[_RENDER_JS.index("function L(p){"):_RENDER_JS.index("f.p.forEach(function(p){")]
_HEATMAP_JS = _RENDER_JS.replace(_LINES_JS, "")

_FRAME_BOX = 'class="attnlib-frame" style="overflow-x:auto;max-width:100%"'

#: What a static slider says where its script has not run: in a notebook that has not been run
#: (JupyterLab and Jupyter leave out the scripts of untrusted outputs). The script removes it
#: and enables the slider, which the markup leaves disabled, so no dead control is shown.
_NOTE_SLIDER = "Run this cell to use the slider."


def frame_setting(frame: Callable[..., Frame], setting: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument ``frame(**setting)`` runs with, defaults filled in, as JSON values.

    A static slider stores it with each frame and a live slider writes it on its redraw
    (``data-setting``), so the two renderings of one setting can be found and compared.

    >>> frame_setting(lambda t, scaled=True: None, {"t": 0.5})
    {'t': 0.5, 'scaled': True}
    """
    try:
        bound = inspect.signature(frame).bind(**setting)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
    except (TypeError, ValueError):  # no signature to read, or one that does not fit
        arguments = dict(setting)
    plain = json.dumps(arguments, default=lambda v: v.item() if hasattr(v, "item") else str(v), ensure_ascii=False)
    return json.loads(plain)


def frame_html(frame: Frame, *, fmt: str = "{:.2f}", cmap: str = "viridis", setting: Mapping[str, Any] | None = None) -> HTML:
    """One :class:`Frame` (its caption and heatmaps) as HTML, with no slider around it.

    A live slider's ``draw`` can display this instead of a matplotlib figure: an HTML table
    redraws far faster than a figure is rendered to PNG, and the live slider then looks exactly
    like its kernel-free twin built by :func:`static_slider` from the same frames.
    ``setting`` (the frame function's arguments) is written on the box as ``data-setting``.
    """
    pal = palette(cmap)
    attr = "" if setting is None else f' data-setting="{html.escape(json.dumps(dict(setting), ensure_ascii=False))}"'
    return HTML(f"{_CELL_STYLE}<div {_FRAME_BOX}{attr}>{_frame_markup(_frame_data(frame, fmt, len(pal)), pal)}</div>")


def _packed_for_script(data: Any) -> str:
    """The frames' data as gzip-compressed JSON in base64 (deterministic: ``mtime=0``).

    The numbers of 72 heatmaps repeat a lot: compressed they take about a fifth of the bytes, which
    keeps the longest chapter's page light. Browsers unpack it with ``DecompressionStream``.
    """
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def unpack_slider_data(markup: str) -> dict[str, Any]:
    """The data of the static slider in ``markup`` (its heatmaps' numbers, colours and labels), as Python objects."""
    packed = re.search(r'<script type="application/gzip" class="attnlib-data">([^<]*)</script>', markup)
    if packed is None:
        raise ValueError("no static slider data found in the markup")
    return json.loads(gzip.decompress(base64.b64decode(packed.group(1))))


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
    running kernel would draw for those settings. The first frame shown is HTML (readable with
    no JavaScript); every frame's numbers are stored once as JSON and drawn when the slider moves.

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
    settings = [dict(s) for s in settings]
    frames = [frame(**s) for s in settings]
    if not frames:
        raise ValueError("static_slider needs at least one setting")
    if not 0 <= initial < len(frames):
        raise ValueError(f"initial = {initial} is out of range for {len(frames)} settings")
    pal = palette(cmap)
    data = [{**_frame_data(f, fmt, len(pal)), "a": frame_setting(frame, s)} for f, s in zip(frames, settings)]
    used = sorted({k for d in data for p in d["p"] for k in p["i"] if k >= 0})
    lines = any(p.get("y") == "lines" for d in data for p in d["p"])
    styles = {"hidden": _HIDDEN, "masked": _MASKED, "head": _HEAD, "rowhead": _ROW_HEAD, "corner": _CORNER}
    payload = _packed_for_script({"s": styles, "pal": {str(k): pal[k] for k in used}, "f": data})
    uid = "attnlib-slider-" + hashlib.sha1((title + slider_label + payload).encode()).hexdigest()[:10]
    labels = [f.label for f in frames]
    esc = html.escape
    script = (
        "<script>(function(){"
        f'var root=document.getElementById("{uid}");if(!root)return;'
        'var input=root.querySelector("input[type=range]"),out=root.querySelector(".attnlib-value"),'
        f'box=root.querySelector(".attnlib-frame"),render={_RENDER_JS if lines else _HEATMAP_JS};'
        # The script runs, so the slider works: drop the note meant for a notebook that was not run.
        'root.querySelector(".attnlib-note").remove();input.disabled=false;'
        # Keys that move the slider move only the slider (JupyterLab's command mode would take them).
        'input.onkeydown=function(e){if(/^(Arrow|Page|Home$|End$)/.test(e.key))e.stopPropagation();};'
        'function ready(d){function show(){var k=Number(input.value);if(String(k)!==box.dataset.index){box.innerHTML=render(d,k);box.dataset.index=k;}'
        'out.textContent=d.f[k].l;input.setAttribute("aria-valuetext",d.f[k].l);}'
        'input.addEventListener("input",show);show();root.dataset.ready="1";}'
        'if(!window.DecompressionStream){input.disabled=true;out.textContent+=" (this browser cannot unpack the other frames)";return;}'
        'var b=atob(root.querySelector("script.attnlib-data").textContent),u=new Uint8Array(b.length);'
        'for(var i=0;i<b.length;i++)u[i]=b.charCodeAt(i);'
        'new Response(new Blob([u]).stream().pipeThrough(new DecompressionStream("gzip"))).json().then(ready);})();</script>'
    )
    markup = (
        f'{_CELL_STYLE}<div id="{uid}" class="attnlib-slider" role="group" aria-labelledby="{uid}-title" aria-describedby="{uid}-alt">'
        f'<div id="{uid}-title" style="font-weight:bold;font-size:1.05em">{esc(title)}</div>'
        f'<div id="{uid}-alt" style="{_HIDDEN}">{esc(alt)}</div>'
        f'<div style="margin:6px 0"><label for="{uid}-input">{esc(slider_label)}:</label> '
        f'<input id="{uid}-input" type="range" min="0" max="{len(frames) - 1}" step="1" value="{initial}" '
        f'aria-valuetext="{esc(labels[initial])}" style="vertical-align:middle;width:16em;max-width:60%" disabled> '
        f'<output class="attnlib-value" for="{uid}-input" aria-hidden="true">{esc(labels[initial])}</output></div>'
        f'<p class="attnlib-note" style="font-style:italic;margin:4px 0">{_NOTE_SLIDER}</p>'
        f'<div {_FRAME_BOX} data-index="{initial}">{_frame_markup(data[initial], pal)}</div>'
        f'<script type="application/gzip" class="attnlib-data">{payload}</script>{script}</div>'
    )
    return HTML(markup)


#: What a live slider's cell shows before it has run (its stored output: the text form of the
#: widget, which a notebook without the widget's state cannot draw). ``tools/sync_notebooks.py``
#: keeps only this note in a live-slider cell's stored outputs.
LIVE_NOTE = "Run this cell to use the live slider (it needs a running kernel)."

#: The fold of a static slider whose live twin is on the page (see _LIVE_KEYS): its button's text.
TWIN_SHOW = "Show the same figure, precomputed for reading without a kernel"
TWIN_HIDE = "Hide the precomputed copy"

# Arrow, Page, Home and End keys pressed in a live slider's controls move the control and nothing
# else: JupyterLab's command mode takes them from a dropdown (a <select>) to move between cells.
# A listener on the document, in the capture phase (before the control sees the key), stops the
# key on its way back up at the slider's box, after the control has used it. Installed once per page.
#
# Then the static twin: in a notebook where a live slider has been drawn (JupyterLab, after its
# cell ran), the first static slider after it (the twin: the same frames, precomputed for the
# website) is folded behind one button, so the figure shows once. Cells are scanned whenever the
# notebook's DOM changes (a cell ran). Colab draws each output in a frame of its own, which this
# script cannot see into, and the website has no live slider: both show the static slider as it is.
_LIVE_KEYS = (
    "<script>(function(){if(window.attnlibLiveKeys)return;window.attnlibLiveKeys=true;"
    'document.addEventListener("keydown",function(e){'
    'var box=e.target&&e.target.closest&&e.target.closest(".attnlib-live");'
    "if(!box||!/^(Arrow|Page|Home$|End$)/.test(e.key))return;"
    "function stop(ev){ev.stopPropagation();}"
    'box.addEventListener("keydown",stop);setTimeout(function(){box.removeEventListener("keydown",stop);},0);'
    "},true);"
    'var css=document.createElement("style");css.textContent=".attnlib-slider.attnlib-twin:not(.attnlib-open)>'
    ':not(.attnlib-twin-label){display:none}.attnlib-twin-label{font:inherit;color:inherit;background:none;'
    'border:1px solid currentColor;border-radius:4px;padding:2px 8px;margin:4px 0;cursor:pointer}";'
    "document.head.appendChild(css);"
    "function fold(s){s.classList.add(\"attnlib-twin\");var b=document.createElement(\"button\");"
    'b.type="button";b.className="attnlib-twin-label";b.setAttribute("aria-expanded","false");'
    f'b.textContent="{TWIN_SHOW}";'
    'b.onclick=function(){var o=s.classList.toggle("attnlib-open");b.setAttribute("aria-expanded",String(o));'
    f'b.textContent=o?"{TWIN_HIDE}":"{TWIN_SHOW}";}};s.insertBefore(b,s.firstChild);}}'
    'function scan(){document.querySelectorAll(".jp-Notebook").forEach(function(nb){var live=false;'
    'nb.querySelectorAll(".jp-Cell").forEach(function(c){if(c.querySelector(".attnlib-live")){live=true;return;}'
    'var s=c.querySelector(".attnlib-slider");if(!s)return;'
    'if(live&&!s.classList.contains("attnlib-twin"))fold(s);live=false;});});}'
    "var t=null;new MutationObserver(function(){if(t===null)t=setTimeout(function(){t=null;scan();},50);})"
    ".observe(document.body,{childList:true,subtree:true});scan();"
    "})();</script>"
)


def live_slider(frame: Callable[..., Frame], *, fmt: str = "{:.2f}", cmap: str = "viridis", **controls: Any) -> Any:
    """Show ``frame(**values)`` under ipywidgets controls, redrawn whenever a control moves.

    ``controls`` are what ``ipywidgets.interactive`` accepts, e.g.
    ``temperature=ipywidgets.FloatLogSlider(value=1, base=10, min=-1, max=1)``.
    Needs a running kernel; on the static website use :func:`static_slider` with the same
    ``frame`` (and the same ``fmt`` and ``cmap``, which mean what they mean there, so that both
    draw a setting alike). In the book, tag the cell ``remove-output`` and ``nbval-ignore-output``.

    Each redraw carries its setting (:func:`frame_setting`) as ``data-setting``, which the
    JupyterLab tests use to find the static slider's frame for the same setting.

    Returns:
        The ``ipywidgets.interactive`` widget (already displayed).
    """
    import ipywidgets
    from IPython.display import display

    def draw(**values: Any) -> None:
        display(frame_html(frame(**values), fmt=fmt, cmap=cmap, setting=frame_setting(frame, values)))

    widget = ipywidgets.interactive(draw, **controls)
    widget.add_class("attnlib-live")
    display(HTML(_LIVE_KEYS))
    # The widget's text form is what a notebook shows where the widget cannot be drawn (before
    # the cell has run, the stored output): a note, not the widget's repr.
    if hasattr(widget, "_repr_mimebundle_"):  # ipywidgets 8
        display({**widget._repr_mimebundle_(), "text/plain": LIVE_NOTE}, raw=True)
    else:  # ipywidgets 7 (Colab): the same view, then the display hook that draws the first frame
        view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
        display({"application/vnd.jupyter.widget-view+json": view, "text/plain": LIVE_NOTE}, raw=True)
        widget._handle_displayed()
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
