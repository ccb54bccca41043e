"""No figure text under 11 px on a 390 px phone: every stored image of every chapter says so itself.

When attnbook is imported in IPython, each PNG a figure is rendered to carries the size of its
smallest drawn text in CSS px on a 390 px phone (``attnbook.figures.TEXT_KEY``, a tEXt chunk; see
:func:`attnbook.figures.install_png_text_size`). This test reads it from every stored image of every
chapter (``image/png`` outputs, and PNGs inside HTML outputs such as a slider's frames) and fails
when it is missing or under ``MIN_TEXT_PX``, naming the chapter, the cell and the value.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from toc import ROOT, toc_notebooks

from attnbook.figures import MIN_TEXT_PX, TEXT_KEY, install_png_text_size, png_min_text_px

NOTEBOOKS = toc_notebooks()
_DATA_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=\s]+)")


def stored_pngs(nb: dict[str, Any]) -> list[tuple[int, str, bytes]]:
    """``(cell index, where, PNG bytes)`` of every image stored in a notebook's outputs."""
    found = []
    for index, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            data = out.get("data", {})
            if "image/png" in data:
                found.append((index, "image/png", base64.b64decode("".join(data["image/png"]))))
            html = "".join(data.get("text/html", ""))
            for k, match in enumerate(_DATA_PNG.finditer(html)):
                found.append((index, f"PNG {k} in text/html", base64.b64decode(re.sub(r"\s", "", match.group(1)))))
    return found


def problems(name: str, nb: dict[str, Any]) -> list[str]:
    """What is wrong with a notebook's stored images, one line each (empty when all is well)."""
    out = []
    for index, where, png in stored_pngs(nb):
        value = png_min_text_px(png)
        if value is None:
            out.append(f"{name}, cell {index} ({where}): no {TEXT_KEY} (render it with attnbook imported)")
        elif value < MIN_TEXT_PX:
            out.append(f"{name}, cell {index} ({where}): smallest text {value:.1f} px at 390 px, "
                       f"need >= {MIN_TEXT_PX:g} px")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_figure_text_legible_at_phone_width(path: Path) -> None:
    nb = json.loads((ROOT / path).read_text(encoding="utf-8"))
    found = problems(path.stem, nb)
    assert not found, "figure text too small on a 390 px phone:\n" + "\n".join(found)


def _figure_png(fontsize: float, width_in: float, **savefig: Any) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    install_png_text_size()
    fig, ax = plt.subplots(figsize=(width_in, 2.5), dpi=100)
    ax.plot([0, 1], [0, 1])
    ax.set_title("title", fontsize=14)
    ax.tick_params(labelsize=fontsize)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    plt.close(fig)
    return buffer.getvalue()


def _notebook_with(png: bytes, html: bool = False) -> dict[str, Any]:
    b64 = base64.b64encode(png).decode("ascii")
    data = {"text/html": f'<div><img src="data:image/png;base64,{b64}"></div>'} if html else {"image/png": b64}
    return {"cells": [{"cell_type": "markdown", "source": "x"},
                      {"cell_type": "code", "outputs": [{"output_type": "display_data", "data": data}]}]}


def test_a_small_font_figure_fails() -> None:
    # 8 pt tick labels at 100 dpi are 11.1 px; a 7 inch figure (about 6 inches once cropped tight)
    # shown 358 px wide makes them about 6.7 px.
    png = _figure_png(8, 7.0, bbox_inches="tight")
    value = png_min_text_px(png)
    assert value is not None and 5.5 < value < 7.5, value
    for html in (False, True):
        found = problems("99_planted", _notebook_with(png, html=html))
        assert len(found) == 1 and "99_planted, cell 1" in found[0] and f"{value:.1f} px" in found[0], found


def test_a_phone_sized_figure_passes_and_a_missing_value_fails() -> None:
    # 3.4 inches at 100 dpi fits the column: 8 pt = 11.1 px stays 11.1 px.
    png = _figure_png(8, 3.4)
    assert png_min_text_px(png) == pytest.approx(8 * 100 / 72, abs=0.06)
    assert problems("99_planted", _notebook_with(png)) == []
    stripped = png.replace(TEXT_KEY.encode(), b"attnbook:something-else")
    found = problems("99_planted", _notebook_with(stripped))
    assert len(found) == 1 and "no attnbook:min-text-px-390" in found[0], found


def test_retina_and_inline_figures_are_measured_at_their_css_width() -> None:
    """IPython's retina PNG is drawn at twice the dpi and shown at half its pixel width: same value."""
    pytest.importorskip("IPython")
    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure

    install_png_text_size()
    values = []
    for fmt in ("png", "retina"):
        fig, ax = plt.subplots(figsize=(7.0, 2.5), dpi=100)
        ax.set_title("a title", fontsize=10)
        ax.plot([0, 1], [0, 1])
        ax.tick_params(labelsize=10)
        values.append(png_min_text_px(print_figure(fig, fmt)))
        plt.close(fig)
    assert values[0] == pytest.approx(values[1], abs=0.11)
    assert values[0] < 10 * 100 / 72  # a 7 inch figure is shrunk to the column
