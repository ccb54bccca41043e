"""Explanatory diagrams drawn from code: small SVG pictures of an idea, not plots of a run.

A chapter draws its diagrams in ``attnbook/chNN.py`` with :class:`Diagram` and registers each
with :func:`diagram`; ``tools/build_diagrams.py`` writes them to ``book/diagrams/NAME.svg`` and a
markdown cell shows one where its idea first appears::

    ![<the diagram's alt text>](diagrams/ch02_qkv_path.svg)

``tests/test_diagrams.py`` regenerates every registered diagram and fails when a stored file
differs (a picture cannot drift from the constants it was drawn from), when a markdown cell's alt
text differs from the diagram's, or when a diagram breaks the rules below.

Rules every diagram keeps (checked when it is drawn, so a bad one fails loudly):

* **legible on a phone**: shown at most 358 px wide (a 390 px screen less the page's margins),
  no text is smaller than 11 px. A diagram ``width`` px wide is scaled by ``min(1, 358 / width)``,
  so a 420 px diagram needs 13 px text, a 600 px one 19 px;
* **colour-blind safe**: fills and strokes come from :data:`PALETTE` (Okabe-Ito) and its tints;
* **dark mode**: the picture carries its own light card, so it reads the same on a dark page;
* **alt text** that says what the picture shows, and a title.

Text may carry sub- and superscripts: ``"W^{Q}"``, ``"D_{k}"``, ``"softmax(QK^{T})"``.

>>> d = Diagram("ch00_demo", 300, 120, title="A box and an arrow", alt="A box labelled X with an arrow to the right.")
>>> d.box(20, 40, 80, 44, "X", sub="[S, D]")
>>> d.arrow(100, 62, 200, 62, label="W^{Q}")
>>> d.svg().startswith("<svg")
True
"""

from __future__ import annotations

import html
import importlib
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["PALETTE", "TINT", "INK", "MUTED", "Diagram", "diagram", "registered", "PHONE_WIDTH", "MIN_TEXT_PX"]

#: Okabe-Ito colours (colour-blind safe), by name.
PALETTE: dict[str, str] = {
    "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999",
}
#: Light tints of the same colours, for fills behind dark text (contrast with INK above 10:1).
TINT: dict[str, str] = {
    "orange": "#FBE7BF", "sky": "#D5ECFA", "green": "#BFE7DC", "yellow": "#FBF8CF",
    "blue": "#BFDCEC", "vermillion": "#F5D5BF", "purple": "#F2DEE9", "grey": "#E6E6E6",
}
INK = "#1A1A1A"      # text and lines
MUTED = "#595959"    # secondary text (7:1 on white)
CARD = "#FFFFFF"     # the diagram's own background
PHONE_WIDTH = 358    # px a diagram gets on a 390 px screen
MIN_TEXT_PX = 11.0   # smallest text allowed at that width
SUB_SCALE = 0.8      # sub/superscripts relative to their text
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"

_ALLOWED = {c.upper() for c in (*PALETTE.values(), *TINT.values(), INK, MUTED, CARD)} | {"NONE"}


def _colour(c: str, tint: bool = False) -> str:
    if c in PALETTE:
        return TINT[c] if tint else PALETTE[c]
    if c.upper() not in _ALLOWED:
        raise ValueError(f"colour {c!r} is not in the book's palette; use one of {sorted(PALETTE)} or INK/MUTED")
    return c


_MARK = re.compile(r"([_^])\{([^}]*)\}")


def _tspans(s: str, size: float) -> tuple[str, list[float]]:
    """SVG markup for ``s`` with ``^{..}``/``_{..}`` as raised/lowered smaller text; also the sizes used."""
    out, sizes, pos = [], [size], 0
    small = round(size * SUB_SCALE, 2)
    for m in _MARK.finditer(s):
        out.append(html.escape(s[pos:m.start()]))
        shift = "super" if m.group(1) == "^" else "sub"
        out.append(f'<tspan baseline-shift="{shift}" font-size="{small:g}">{html.escape(m.group(2))}</tspan>')
        sizes.append(small)
        pos = m.end()
    out.append(html.escape(s[pos:]))
    return "".join(out), sizes


def text_width(s: str, size: float) -> float:
    """A rough width in px of ``s`` at ``size`` px (for laying out boxes; 0.6 em per character)."""
    plain = _MARK.sub(lambda m: m.group(2), s)
    small = sum(len(m.group(2)) for m in _MARK.finditer(s))
    return 0.6 * size * (len(plain) - small) + 0.6 * size * SUB_SCALE * small


@dataclass
class Diagram:
    """An SVG picture ``width`` x ``height`` px, drawn with boxes, grids, arrows and text.

    Args:
        name: file name without ``.svg`` (``chNN_what``), also the registry key.
        width, height: natural size in px (shown at this size on a desktop, scaled down on a phone).
        title: a short title (the SVG's ``<title>``).
        alt: alt text for the markdown image: what the picture shows, in a sentence or three.
    """

    name: str
    width: int
    height: int
    title: str
    alt: str
    _parts: list[str] = field(default_factory=list, repr=False)
    _sizes: list[float] = field(default_factory=list, repr=False)
    _heads: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"ch\d\d_[a-z0-9_]+", self.name):
            raise ValueError(f"diagram name {self.name!r} should look like 'ch02_qkv_path'")
        if not self.alt.strip() or not self.title.strip():
            raise ValueError(f"diagram {self.name!r} needs a title and alt text")

    @property
    def phone_scale(self) -> float:
        return min(1.0, PHONE_WIDTH / self.width)

    # ---- drawing -------------------------------------------------------------------------------
    def text(self, x: float, y: float, s: str, *, size: float = 14, anchor: str = "middle",
             color: str = INK, weight: str = "normal", italic: bool = False) -> None:
        """Text with its baseline at ``y`` (``anchor``: start, middle or end)."""
        body, sizes = _tspans(s, size)
        self._sizes += sizes
        style = ' font-style="italic"' if italic else ""
        self._parts.append(
            f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" text-anchor="{anchor}" fill="{_colour(color)}"'
            f' font-weight="{weight}"{style}>{body}</text>')

    def rect(self, x: float, y: float, w: float, h: float, *, fill: str = "none", stroke: str = INK,
             rx: float = 4, dash: bool = False, width: float = 1.5, tint: bool = False) -> None:
        d = ' stroke-dasharray="5 4"' if dash else ""
        self._parts.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" fill="{_colour(fill, tint)}"'
            f' stroke="{_colour(stroke)}" stroke-width="{width:g}"{d}/>')

    def box(self, x: float, y: float, w: float, h: float, label: str, *, sub: str | None = None,
            color: str = "blue", size: float = 15, dash: bool = False) -> None:
        """A tinted box with a centred label and an optional smaller second line (a shape, say)."""
        self.rect(x, y, w, h, fill=color, tint=True, stroke=color, dash=dash, width=2)
        if sub is None:
            self.text(x + w / 2, y + h / 2 + size * 0.35, label, size=size)
        else:
            s2 = max(size - 2, 12)
            self.text(x + w / 2, y + h / 2 - 2, label, size=size)
            self.text(x + w / 2, y + h / 2 + s2 + 1, sub, size=s2, color=MUTED)

    def line(self, x1: float, y1: float, x2: float, y2: float, *, color: str = INK, width: float = 1.5,
             dash: bool = False) -> None:
        d = ' stroke-dasharray="5 4"' if dash else ""
        self._parts.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{_colour(color)}"'
                           f' stroke-width="{width:g}"{d}/>')

    def arrow(self, x1: float, y1: float, x2: float, y2: float, *, color: str = INK, label: str | None = None,
              size: float = 14, dash: bool = False, label_side: float = -6) -> None:
        """An arrow from (x1, y1) to (x2, y2), its label centred ``label_side`` px above it."""
        c = _colour(color)
        self._parts.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{c}" stroke-width="1.8"'
            f' marker-end="url(#{self.name}-head-{c[1:]})"' + (' stroke-dasharray="5 4"' if dash else "") + "/>")
        self._heads.add(c)
        if label:
            self.text((x1 + x2) / 2, (y1 + y2) / 2 + label_side, label, size=size, color=color)

    def grid(self, x: float, y: float, fills: Sequence[Sequence[str]], *, cell: float = 26,
             labels: Sequence[Sequence[str]] | None = None, row_labels: Sequence[str] | None = None,
             col_labels: Sequence[str] | None = None, size: float = 14, gap: float = 0) -> None:
        """A matrix of cells: ``fills[r][c]`` a palette name (tinted), ``"none"`` or a colour.

        ``labels[r][c]`` is written in the cell; row labels go left of it, column labels above.
        """
        for r, row in enumerate(fills):
            for c, f in enumerate(row):
                cx, cy = x + c * (cell + gap), y + r * (cell + gap)
                self.rect(cx, cy, cell, cell, fill=f, tint=f in PALETTE, stroke=INK, rx=0, width=1)
                if labels is not None and labels[r][c]:
                    self.text(cx + cell / 2, cy + cell / 2 + size * 0.35, labels[r][c], size=size)
        if row_labels:
            for r, s in enumerate(row_labels):
                self.text(x - 6, y + r * (cell + gap) + cell / 2 + size * 0.35, s, size=size, anchor="end")
        if col_labels:
            for c, s in enumerate(col_labels):
                self.text(x + c * (cell + gap) + cell / 2, y - 6, s, size=size)

    # ---- output --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``ValueError`` when some text would be under 11 px on a 390 px screen."""
        if not self._sizes:
            return
        smallest = min(self._sizes) * self.phone_scale
        if smallest < MIN_TEXT_PX - 1e-9:
            raise ValueError(
                f"diagram {self.name!r}: its smallest text ({min(self._sizes):g} px) shows at {smallest:.1f} px"
                f" on a phone (scale {self.phone_scale:.2f} for width {self.width}); need >= {MIN_TEXT_PX:g} px:"
                f" make the text larger or the diagram narrower")

    def svg(self) -> str:
        """The SVG document (checks legibility first)."""
        self.check()
        defs = "".join(
            f'<marker id="{self.name}-head-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"'
            f' markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
            for c in sorted(self._heads))
        body = "\n".join(self._parts)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}"'
            f' viewBox="0 0 {self.width} {self.height}" role="img" font-family="{FONT}">\n'
            f"<title>{html.escape(self.title)}</title>\n<desc>{html.escape(self.alt)}</desc>\n"
            f"<defs>{defs}</defs>\n"
            f'<rect x="0" y="0" width="{self.width}" height="{self.height}" rx="8" fill="{CARD}"/>\n'
            f"{body}\n</svg>\n")

    def _repr_svg_(self) -> str:
        return self.svg()


_REGISTRY: dict[str, Callable[[], Diagram]] = {}
_CHAPTERS = [f"attnbook.ch{n:02d}" for n in range(1, 12)]


def diagram(fn: Callable[[], Diagram]) -> Callable[[], Diagram]:
    """Register a function that draws one diagram (its name is the diagram's ``name``)."""
    _REGISTRY[fn.__module__ + "." + fn.__name__] = fn
    return fn


def registered() -> dict[str, Diagram]:
    """Every registered diagram, drawn, by name (imports the chapter modules first)."""
    for mod in _CHAPTERS:
        importlib.import_module(mod)
    out: dict[str, Diagram] = {}
    for key, fn in _REGISTRY.items():
        d = fn()
        if d.name in out:
            raise ValueError(f"two diagrams are named {d.name!r} (the second from {key})")
        out[d.name] = d
    return out
