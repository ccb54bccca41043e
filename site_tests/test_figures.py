"""Pictures and outputs at a phone's and a desktop's width, in light and dark mode.

For every page of the table of contents, at 390 px and 1366 px, light and dark:

* every image in the article has alt text (the diagrams' and the figures' own words);
* every explanatory diagram (``book/diagrams/*.svg``, drawn by :mod:`attnbook.diagrams`) shows no
  text smaller than 11 px: its smallest font size times the width it is shown at over its own width;
* the book's HTML outputs (sliders, quizzes, checker feedback, printed tables) follow the theme:
  on the dark page none of them is a bright slab (the background a reader sees behind them is as
  dark as the page), on the light page none is dark. Contrast inside them is axe-core's part
  (``test_pages.py``, light and dark).

What was measured goes into ``_build/site-report.json`` (smallest diagram text per page and width).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
from sitekit import PAGES, TocPage, Visit, open_page, record, set_mode

MIN_TEXT_PX = 11.0
WIDTHS = (390, 1366)

#: For each image in the article: its source, alt text, the width it is shown at and its own width.
IMAGES = """() => [...document.querySelectorAll('article img, .bd-article img')].map(img => ({
  src: img.currentSrc || img.src, alt: (img.getAttribute('alt') || '').trim(),
  shown: img.getBoundingClientRect().width, natural: img.naturalWidth,
  hidden: img.getBoundingClientRect().width === 0 && img.closest('details:not([open])') !== null}))"""

#: The background a reader sees behind an element: the first opaque background up its ancestors
#: (alpha-blended ones folded in), as [r, g, b] 0-255.
BACKDROP = """el => {
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const m = getComputedStyle(e).backgroundColor.match(/[\\d.]+/g).map(Number);
    const a = m.length > 3 ? m[3] : 1;
    if (a > 0) layers.push([m[0], m[1], m[2], a]);
    if (a >= 1) break;
  }
  let rgb = [255, 255, 255];
  for (const [r, g, b, a] of layers.reverse()) rgb = [r * a + rgb[0] * (1 - a), g * a + rgb[1] * (1 - a), b * a + rgb[2] * (1 - a)];
  return rgb;
}"""

#: The book's HTML outputs whose box should follow the theme (heatmap cells keep their own colours).
OUTPUTS = ".attnlib-slider, .attnbook-quiz, .attnlib-feedback, .cell_output .output.text_html > table, .cell_output .output.text_html table.dataframe"


def luminance(rgb: list[float]) -> float:
    """WCAG relative luminance of an sRGB colour (0 black, 1 white)."""
    def lin(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def svg_min_font_px(svg: str) -> tuple[float, float]:
    """(smallest font-size in px, the SVG's own width in px) of a diagram's source."""
    width = float(re.search(r'<svg[^>]*\swidth="([\d.]+)', svg).group(1))
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)(?:px)?"', svg)]
    return (min(sizes) if sizes else float("inf")), width


@pytest.fixture(scope="module", params=[(p, w) for p in PAGES for w in WIDTHS], ids=lambda pw: f"{pw[0]}-{pw[1]}")
def visit(request: pytest.FixtureRequest, browser: Any, base_url: str) -> Iterator[tuple[TocPage, int, Visit]]:
    toc_page, width = request.param
    v = open_page(browser, base_url + toc_page.url_path, width=width, height=900)
    yield toc_page, width, v
    v.page.context.close()


def test_every_image_has_alt_text(visit: tuple[TocPage, int, Visit]) -> None:
    toc_page, width, v = visit
    images = v.page.evaluate(IMAGES)
    missing = [i["src"].rsplit("/", 1)[-1] for i in images if not i["alt"]]
    assert not missing, f"{v.url} at {width} px: images without alt text: {missing}"


def test_diagram_text_is_legible(visit: tuple[TocPage, int, Visit]) -> None:
    toc_page, width, v = visit
    page = v.page
    smallest, problems = float("inf"), []
    for img in page.evaluate(IMAGES):
        if not img["src"].endswith(".svg") or "/_images/ch" not in img["src"] or img["hidden"]:
            continue
        svg = page.evaluate("async u => (await fetch(u)).text()", img["src"])
        font, natural = svg_min_font_px(svg)
        assert img["shown"] > 0, f"{v.url}: diagram {img['src']} is not shown"
        shown = font * img["shown"] / natural
        smallest = min(smallest, shown)
        if shown < MIN_TEXT_PX - 1e-6:
            problems.append(f"{img['src'].rsplit('/', 1)[-1]}: {font:g} px text shown at {shown:.1f} px "
                            f"(image {natural:g} px wide shown {img['shown']:.0f} px)")
    if smallest < float("inf"):
        record(str(toc_page), **{f"diagram_min_text_px_{width}": round(smallest, 1)})
    assert not problems, f"{v.url} at {width} px: diagram text under {MIN_TEXT_PX:g} px:\n" + "\n".join(problems)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_outputs_follow_the_theme(visit: tuple[TocPage, int, Visit], mode: str) -> None:
    toc_page, width, v = visit
    page = v.page
    set_mode(page, mode)
    try:
        body = luminance(page.evaluate(BACKDROP, page.query_selector("body") or page.query_selector("html")))
        glaring = []
        for el in page.query_selector_all(OUTPUTS):
            if not el.is_visible():
                continue
            lum = luminance(page.evaluate(BACKDROP, el))
            # The page's own luminance is about 0.006 (dark) or 1.0 (light): an output box must be on
            # the page's side of the scale, not a slab of the other mode.
            if (mode == "dark" and lum > 0.2) or (mode == "light" and lum < 0.5):
                cls = page.evaluate("e => e.className", el)
                glaring.append(f"{cls}: backdrop luminance {lum:.2f} on a page of {body:.2f}")
    finally:
        set_mode(page, "light")
    assert not glaring, f"{v.url} at {width} px, {mode} mode: outputs that do not follow the theme:\n" + "\n".join(glaring[:20])
