"""The menus a reader uses to move around, tapped and clicked as a reader does.

* On a phone (390 px) and a tablet (800 px), with a touch screen: the visible hamburger opens the
  table of contents as a drawer that lists every chapter, the contents button opens the page's
  sections, a tap beside a drawer closes it, and a chapter link in the drawer opens that chapter.
  (pydata-sphinx-theme 0.17 binds only the first ``.primary-toggle`` of a page, issue #2451; with the
  theme's top navbar in the page that was a hidden one, and both buttons did nothing.)
* On a desktop (1366 px): no second header holding only a second search field, and the hamburger
  hides the sidebar and shows it again.

Screenshots of the open drawers, light and dark: ``_build/screenshots/menu-*.png``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from sitekit import NOTEBOOK_PAGES, PAGES, SCREENSHOTS, Visit, open_page, set_mode, unexpected_errors

#: The chapter the review's phone reader was stuck in: the longest page.
PAGE = next((p for p in NOTEBOOK_PAGES if p.source.stem.startswith("08_")), NOTEBOOK_PAGES[0])
SIZES = {390: 844, 800: 1000}


@pytest.fixture(scope="module", params=sorted(SIZES), ids=lambda w: f"{w}px")
def touch_visit(request: pytest.FixtureRequest, browser: Any, base_url: str) -> Iterator[tuple[int, Visit]]:
    width = request.param
    v = open_page(browser, base_url + PAGE.url_path, width=width, height=SIZES[width], touch=True)
    yield width, v
    v.page.context.close()


def _visible_button(v: Visit, kind: str) -> Any:
    """The one ``kind`` sidebar button a reader sees (in the article header)."""
    buttons = v.page.locator(f".{kind}-toggle:visible")
    assert buttons.count() == 1, f"{v.url}: {buttons.count()} visible {kind} sidebar buttons"
    return buttons.first


def _dialog_box(v: Visit, kind: str) -> dict[str, float]:
    dialog = v.page.locator(f"#pst-{kind}-sidebar-modal")
    dialog.wait_for(state="visible", timeout=10_000)
    box = dialog.bounding_box()
    assert box and box["width"] >= 200 and box["height"] >= 300, f"{v.url}: the {kind} drawer is {box}"
    return box


def _tap_beside(v: Visit, kind: str, box: dict[str, float], width: int) -> None:
    """Tap the dimmed page beside the drawer: the drawer closes."""
    x = box["x"] + box["width"] + 20 if kind == "primary" else box["x"] - 20
    assert 0 < x < width, f"{v.url}: no page left beside the {kind} drawer to tap ({box})"
    v.page.touchscreen.tap(x, SIZES[width] / 2)
    v.page.wait_for_function(f"() => !document.getElementById('pst-{kind}-sidebar-modal').open", timeout=10_000)


def _no_errors(v: Visit, before: int, doing: str) -> None:
    new = unexpected_errors(v.errors[before:])
    assert not new, f"{v.url}: JavaScript errors while {doing}: {new}"


def test_table_of_contents_drawer_opens_and_closes(touch_visit: tuple[int, Visit]) -> None:
    width, v = touch_visit
    page, before = v.page, len(v.errors)
    _visible_button(v, "primary").tap()
    box = _dialog_box(v, "primary")
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"{v.url}: the drawer is off-screen: {box}"
    hrefs = page.eval_on_selector_all("#pst-primary-sidebar-modal a[href]", "as => as.map(a => a.href)")
    missing = [p.url_path for p in NOTEBOOK_PAGES if not any(h.split("#")[0].endswith(p.url_path) for h in hrefs)]
    assert not missing, f"{v.url}: the table of contents drawer does not link to {missing}"
    for mode in ("light", "dark"):
        set_mode(page, mode)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"menu-toc-{width}px-{mode}.png"))
    set_mode(page, "light")
    _tap_beside(v, "primary", box, width)
    assert not page.locator("#pst-primary-sidebar-modal").is_visible()
    # the theme moves the contents back into the page's own sidebar when the drawer closes
    assert page.locator("#pst-primary-sidebar a[href]").count() == len(hrefs), f"{v.url}: the sidebar lost links"
    _no_errors(v, before, "opening and closing the table of contents")


def test_page_contents_drawer_opens_and_closes(touch_visit: tuple[int, Visit]) -> None:
    width, v = touch_visit
    page, before = v.page, len(v.errors)
    _visible_button(v, "secondary").tap()
    box = _dialog_box(v, "secondary")
    targets = page.eval_on_selector_all("#pst-secondary-sidebar-modal a[href^='#']", "as => as.map(a => a.hash.slice(1))")
    assert len(targets) >= 3, f"{v.url}: the page contents drawer lists {len(targets)} sections"
    dead = [t for t in targets if not page.evaluate("id => !!document.getElementById(decodeURIComponent(id))", t)]
    assert not dead, f"{v.url}: page contents links to no section: {dead}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"menu-contents-{width}px-light.png"))
    _tap_beside(v, "secondary", box, width)
    assert not page.locator("#pst-secondary-sidebar-modal").is_visible()
    _no_errors(v, before, "opening and closing the page contents")


def test_a_chapter_link_in_the_drawer_opens_the_chapter(touch_visit: tuple[int, Visit]) -> None:
    width, v = touch_visit
    page, before = v.page, len(v.errors)
    target = PAGES[0] if PAGES[0] != PAGE else PAGES[1]
    _visible_button(v, "primary").tap()
    _dialog_box(v, "primary")
    link = page.locator(f"#pst-primary-sidebar-modal a[href$='{target.source.with_suffix('.html').name}']").first
    with page.expect_navigation(wait_until="load"):
        link.tap()
    assert page.url.split("#")[0].endswith(target.url_path), f"tapping {target} in the drawer went to {page.url}"
    _no_errors(v, before, "following a link in the table of contents")


def test_desktop_has_one_header_and_the_hamburger_hides_the_sidebar(browser: Any, base_url: str) -> None:
    v = open_page(browser, base_url + PAGE.url_path, width=1366)
    try:
        page = v.page
        headers = page.evaluate("() => [...document.querySelectorAll('header, .bd-header')]"
                                ".filter(e => e.getBoundingClientRect().height > 0).map(e => e.id || e.className)")
        assert not headers, f"{v.url}: a header above the page: {headers}"
        fields = page.locator(".search-button-field:visible").count()
        assert fields == 1, f"{v.url}: {fields} search fields visible (one belongs in the sidebar)"
        sidebar = page.locator("#pst-primary-sidebar")
        assert sidebar.is_visible()
        _visible_button(v, "primary").click()
        sidebar.wait_for(state="hidden", timeout=10_000)
        assert not page.locator("#pst-primary-sidebar-modal").is_visible(), "the hamburger opened a drawer on a desktop"
        _visible_button(v, "primary").click()
        sidebar.wait_for(state="visible", timeout=10_000)
        assert not unexpected_errors(v.errors), f"{v.url}: {unexpected_errors(v.errors)}"
    finally:
        v.page.context.close()
