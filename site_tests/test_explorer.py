"""The attention explorer (book/explorer.md) in headless Chromium, with the network cut off.

* Before the reader asks for the model, the page stays light: its HTML is under 400 KB and
  neither the model nor the runtime is requested.
* ``window.attnlibLive.run`` gives, in the browser, the tokens and the attention weights of the
  Python model and of attnlib within 1e-4 on five sentences (one cut to 128 tokens).
* A reader using only the keyboard types a sentence, loads the model (the button names its size,
  a progress bar runs), and gets an accessible heatmap, the line view and the chapter's analyses,
  announced in a live region.
* Without WebAssembly, or when the model cannot be downloaded, the page says why and keeps its text.
"""

from __future__ import annotations

import json
from typing import Any, Iterator
from urllib.parse import urlparse

import numpy as np
import pytest

from sitekit import PAGES, SCREENSHOTS, SITE, Visit, open_page, unexpected_errors

from attnbook import explorer as ex


PAGE = "book/explorer.html"
EXPLORER = SITE / "_static" / "explorer"
HEAVY = (".onnx", ".wasm", "/ort/", "vocab.txt")  # what must wait for the reader's request
pytestmark = pytest.mark.skipif(not any(str(p) == "book/explorer" for p in PAGES),
                                reason="book/explorer is not in this table of contents")


def _manifest() -> dict[str, Any]:
    path = EXPLORER / "manifest.json"
    assert path.is_file(), f"{path} is missing: the site was built without the explorer's files (make book)"
    return json.loads(path.read_text(encoding="utf-8"))


RESOURCES = "() => performance.getEntriesByType('resource').map((e) => [e.name, e.encodedBodySize])"


def _ready_button(v: Visit) -> Any:
    button = v.page.locator(".ax-load")
    v.page.wait_for_function("() => !document.querySelector('.ax-load').disabled")
    return button


@pytest.fixture(scope="module")
def live(browser: Any, base_url: str) -> Iterator[Visit]:
    """One page on which the model has been loaded through the API."""
    v = open_page(browser, base_url + PAGE)
    yield v
    v.page.context.close()


def test_page_is_light_until_the_model_is_asked_for(browser: Any, base_url: str) -> None:
    html_bytes = (SITE / PAGE).stat().st_size
    assert html_bytes < 400_000, f"{PAGE} is {html_bytes / 1e3:.0f} KB"
    v = open_page(browser, base_url + PAGE)
    try:
        button = _ready_button(v)
        v.page.wait_for_timeout(500)
        resources = v.page.evaluate(RESOURCES)  # every file the page fetched, with its size
        heavy = [u for u, _ in resources if any(h in u for h in HEAVY)]
        assert not heavy, f"requested before the reader pressed the button: {heavy}"
        assert any(u.endswith("/explorer.mjs") for u, _ in resources)
        explorer = sum(n for u, n in resources if "/_static/explorer/" in u)
        print(f"{PAGE}: HTML {html_bytes / 1e3:.0f} KB, explorer files {explorer / 1e3:.1f} KB, "
              f"all {len(resources)} files after the HTML {sum(n for _, n in resources) / 1e6:.2f} MB")
        m = _manifest()
        total = m["model"]["bytes"] + sum(m["runtime"]["files"].values())
        assert button.inner_text() == f"Load model ({total / 1e6:.1f} MB)"
        assert v.page.get_by_label("Your sentence").input_value() == "The books on the shelf are old."
        assert not unexpected_errors(v.errors) and not v.blocked and not v.failed, (v.errors, v.blocked, v.failed)
    finally:
        v.page.context.close()


RUN = """async (s) => { const r = await window.attnlibLive.run(s);
  return { tokens: r.tokens, attentions: r.attentions, truncated: r.truncated }; }"""


@pytest.mark.parametrize("sentence", ex.EXACT_SENTENCES, ids=lambda s: f"{len(s)}chars")
def test_browser_weights_equal_the_model_and_attnlib(live: Visit, sentence: str) -> None:
    got = live.page.evaluate(RUN, sentence)
    toks, model_w, attnlib_w = ex.reference(sentence)
    assert got["tokens"] == toks
    assert got["truncated"] == (sentence == ex.EXACT_SENTENCES[-1])
    w = np.array(got["attentions"], dtype=np.float64)  # [L, H, S, S]
    assert w.shape == tuple(model_w.shape) == (6, 12, len(toks), len(toks))
    d_model = float(np.abs(w - model_w.double().numpy()).max())
    d_attnlib = float(np.abs(w - attnlib_w.double().numpy()).max())
    print(f"S={len(toks)}: max |browser - model| = {d_model:.2e}, max |browser - attnlib| = {d_attnlib:.2e}")
    assert d_model < 1e-4 and d_attnlib < 1e-4, (d_model, d_attnlib)
    assert not unexpected_errors(live.errors) and not live.blocked and not live.failed


CELLS = """() => {
  const lum = (rgb) => { const c = rgb.match(/\\d+/g).slice(0, 3).map((x) => x / 255)
      .map((x) => x <= 0.04045 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]; };
  const table = document.querySelector('.ax-scroll .ax-heatmap');
  const ratios = [...table.querySelectorAll('td')].map((td) => { const s = getComputedStyle(td);
    const [a, b] = [lum(s.color), lum(s.backgroundColor)].sort((x, y) => y - x); return (a + 0.05) / (b + 0.05); });
  return { rows: table.querySelectorAll('tbody tr').length, cells: ratios.length, worst: Math.min(...ratios),
           emptyHeaders: [...document.querySelectorAll('.ax-root th')].filter((th) => !th.textContent.trim()).length,
           caption: table.querySelector('caption').textContent,
           lines: document.querySelectorAll('.ax-lines line').length };
}"""


def test_reader_types_a_sentence_and_explores_with_the_keyboard(browser: Any, base_url: str) -> None:
    v = open_page(browser, base_url + PAGE)
    page = v.page
    try:
        _ready_button(v)
        field = page.get_by_label("Your sentence")
        field.focus()
        field.fill("")
        page.keyboard.type("The books on the shelf are old.")
        page.keyboard.press("Tab")  # to the Load model button
        assert page.evaluate("() => document.activeElement.className") == "ax-load"
        page.keyboard.press("Enter")
        page.wait_for_function("() => !document.querySelector('.ax-results').hidden", timeout=180_000)
        m = _manifest()  # the bar counts the two large files; the button also the 74 KB of scripts
        total = m["model"]["bytes"] + m["runtime"]["files"]["ort-wasm-simd-threaded.wasm"]
        assert page.inner_text(".ax-progress-text") == f"{total / 1e6:.1f} of {total / 1e6:.1f} MB"
        live_region = page.locator("[aria-live=polite]")
        said = live_region.inner_text()
        assert said.startswith("10 tokens") and "2 heads put the top weight of are on books, first L0H3" in said, said
        state = page.evaluate(CELLS)
        assert state["rows"] == 10 and state["cells"] == 100 and state["emptyHeaders"] == 0, state
        assert state["worst"] >= 4.5, f"a heatmap cell's text has contrast {state['worst']:.2f} < 4.5"
        assert state["lines"] > 0 and state["caption"].startswith("Layer 3, head 1")  # chapter 7's head
        # Keyboard: the layer selector, then a head button from the analyses.
        page.locator(".ax-layer").focus()
        page.keyboard.press("ArrowDown")
        page.wait_for_function("() => document.querySelector('[aria-live=polite]').textContent.startsWith('Showing layer 4')")
        assert page.evaluate(CELLS)["caption"].startswith("Layer 4, head 1")
        page.locator("button.ax-head", has_text="L3H1").first.focus()
        page.keyboard.press("Enter")
        assert page.evaluate(CELLS)["caption"].startswith("Layer 3, head 1")
        assert live_region.inner_text() == "Showing layer 3, head 1."
        # One query's lines only: as many lines as keys, each as opaque as its weight.
        page.locator(".ax-from").select_option("6")
        opacities = page.eval_on_selector_all(".ax-lines line", "ls => ls.map((l) => Number(l.getAttribute('stroke-opacity')))")
        weights = page.evaluate("() => window.attnlibLive.run('The books on the shelf are old.').then((r) => r.attentions[3][1][6])")
        assert np.allclose(opacities, weights, atol=1e-4)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "explorer-live.png"), full_page=True)
        page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; }")
        page.screenshot(path=str(SCREENSHOTS / "explorer-live-dark.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})  # a phone: the wide parts scroll in their boxes
        page.wait_for_timeout(300)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        page.set_viewport_size({"width": 1280, "height": 900})
        # A sentence over 128 tokens is cut, and the page says so.
        field.fill("word " * 140)
        field.press("Enter")
        page.wait_for_function("() => !document.querySelector('.ax-note').hidden")
        assert "the model reads only the first 128" in page.inner_text(".ax-note")
        page.wait_for_function("() => document.querySelector('[aria-live=polite]').textContent.startsWith('128 tokens (cut to 128)')")
        assert not unexpected_errors(v.errors) and not v.blocked and not v.failed, (v.errors, v.blocked, v.failed)
    finally:
        page.context.close()


def test_without_webassembly_the_page_says_why(browser: Any, base_url: str) -> None:
    context = browser.new_context()
    context.add_init_script("delete window.WebAssembly;")
    context.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).hostname == "127.0.0.1" else r.abort())
    page = context.new_page()
    try:
        page.goto(base_url + PAGE)
        page.wait_for_function("() => document.querySelector('.ax-message') && document.querySelector('.ax-message').textContent")
        assert "no WebAssembly" in page.inner_text(".ax-message")
        assert page.locator(".ax-load").is_disabled()
        assert page.get_by_role("heading", name="What the explorer shows").is_visible()
    finally:
        context.close()


def test_a_failed_download_is_explained(browser: Any, base_url: str) -> None:
    v = open_page(browser, base_url + PAGE)
    try:
        v.page.route("**/*.onnx", lambda r: r.fulfill(status=404, body="not here"))
        _ready_button(v).click()
        v.page.wait_for_function("() => window.attnlibLive.status === 'failed'", timeout=120_000)
        said = v.page.inner_text(".ax-message")
        assert "could not be loaded: HTTP 404 for minilm_attention.onnx" in said and "rest of this page works" in said, said
        assert v.page.locator(".ax-load").is_enabled(), "the reader can try again"
        assert v.page.get_by_role("heading", name="How it works").is_visible()
    finally:
        v.page.context.close()
