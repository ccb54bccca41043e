"""The theme's search page works offline: it loads its index and finds words in the book."""

from __future__ import annotations

import json

from typing import Any

import pytest
from sitekit import open_page, unexpected_errors


#: True once the theme's search has listed every result (Sphinx 7.4 writes this summary last).
SEARCH_FINISHED = "() => /Search finished|did not match/i.test(document.querySelector('#search-results').textContent)"


@pytest.mark.parametrize("word, page", [("softmax", "book/glossary.html"), ("ATTNLIB_DEVICE", "book/how_to_use.html")])
def test_search_finds_a_word(word: str, page: str, browser: Any, base_url: str) -> None:
    v = open_page(browser, f"{base_url}search.html?q={word}")
    try:
        # results are listed one by one: read them once the search says it has finished
        v.page.wait_for_function(SEARCH_FINISHED, timeout=60_000)
        hrefs = v.page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.getAttribute('href'))")
        assert any(h.split("#")[0].split("?")[0] == page for h in hrefs), f"searching {word!r} did not find {page}: {hrefs}"
        assert not unexpected_errors(v.errors), v.errors
        assert not v.failed and not v.blocked, (v.failed, v.blocked)
    finally:
        v.page.context.close()


def _pages_mentioning(*spellings: str) -> set[str]:
    from sitekit import PAGES, ROOT

    import re

    def text(p: Any) -> str:
        raw = (ROOT / p.source).read_text(encoding="utf-8")
        if p.is_notebook:  # the cells the website shows (not JupyterLab's remove-cell glossary)
            cells = json.loads(raw)["cells"]
            raw = "\n".join("".join(c["source"]) for c in cells
                             if "remove-cell" not in c.get("metadata", {}).get("tags", []))
        # a link's target ("](09_flash_attention_on_gpus.ipynb)") is not a mention
        return re.sub(r"\]\([^)]*\)", "]", raw).lower()

    return {p.url_path for p in PAGES if any(w in text(p) for w in spellings)}


def test_search_flash_finds_every_page_about_flashattention(browser: Any, base_url: str) -> None:
    expected = _pages_mentioning("flashattention", "flash_attention")
    assert len(expected) >= 3, expected  # the glossary, chapters 8 and 9 and the chapters that point to it
    v = open_page(browser, f"{base_url}search.html?q=flash")
    try:
        v.page.wait_for_function(SEARCH_FINISHED, timeout=60_000)
        hrefs = v.page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.getAttribute('href'))")
        found = {h.split("#")[0].split("?")[0] for h in hrefs}
        assert expected <= found, f"searching 'flash' missed {sorted(expected - found)} (found {sorted(found)})"
    finally:
        v.page.context.close()


def test_search_reports_no_match(browser: Any, base_url: str) -> None:
    v = open_page(browser, f"{base_url}search.html?q=zqxjkvbwordnotinthebook")
    try:
        v.page.wait_for_function(
            "() => /did not match any|no documents? match/i.test(document.querySelector('#search-results').textContent)",
            timeout=60_000,
        )
        assert v.page.locator("#search-results ul.search li").count() == 0
    finally:
        v.page.context.close()
