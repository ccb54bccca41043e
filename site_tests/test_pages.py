"""Every page of the table of contents, opened in headless Chromium with the network cut off.

Each page is loaded once (a module-scoped fixture per page); the tests below then look at it in
order: screenshot, errors, math, quiz, sliders, solutions, launch buttons.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
from sitekit import (
    CONFIG,
    PAGES,
    ROOT,
    SCREENSHOTS,
    TocPage,
    Visit,
    open_page,
    unexpected_errors,
)


@pytest.fixture(scope="module", params=PAGES, ids=str)
def visit(request: pytest.FixtureRequest, browser: Any, base_url: str) -> Iterator[tuple[TocPage, Visit]]:
    toc_page: TocPage = request.param
    v = open_page(browser, base_url + toc_page.url_path)
    yield toc_page, v
    v.page.context.close()


def _no_new_errors(v: Visit, before: int, doing: str) -> None:
    new = unexpected_errors(v.errors[before:])
    assert not new, f"{v.url}: JavaScript errors while {doing}: {new}"


def test_screenshot(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{toc_page.source.stem}.png"
    v.page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


def test_page_loads_offline_without_errors(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    assert not unexpected_errors(v.errors), f"{v.url}: JavaScript errors: {unexpected_errors(v.errors)}"
    assert not v.failed, f"{v.url}: local requests failed (missing files in the build?): {v.failed}"
    # Every request to another host was blocked (and recorded). The book asks for none at all:
    # the theme, MathJax, its fonts, the quizzes and the sliders are all served with the site.
    assert not v.blocked, f"{v.url} requests resources from the network: {v.blocked}"
    title = v.page.title()
    assert title and "404" not in title, f"{v.url}: title {title!r}"
    assert v.page.locator("main h1").count() >= 1, f"{v.url}: no heading"


MATH_STATE = """() => {
  const math = [...document.querySelectorAll('.math, .Quiz')];
  const clone = document.querySelector('main').cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container').forEach(e => e.remove());
  const text = clone.textContent;
  return {
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('mjx-container').length,
    untypeset: [...document.querySelectorAll('.math')].filter(e => !e.querySelector('mjx-container'))
                 .map(e => e.textContent.slice(0, 60)),
    raw: (text.match(/\\$\\$|\\\\\\(|\\\\\\[|\\\\frac|\\\\sqrt/g) || []),
    merror: document.querySelectorAll('mjx-merror').length,
  };
}"""


def test_math_is_rendered(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    state = v.page.evaluate(MATH_STATE)
    assert not state["raw"], f"{v.url}: raw TeX left in the page text (math not rendered): {state['raw'][:5]}"
    if state["math"] == 0:
        return
    assert not state["untypeset"], f"{v.url}: math MathJax did not process: {state['untypeset'][:5]}"
    assert state["typeset"] >= state["math"], state
    assert state["merror"] == 0, f"{v.url}: {state['merror']} TeX errors rendered by MathJax"
    assert v.page.evaluate("() => MathJax.version").startswith("3."), "MathJax is not the bundled MathJax 3"
    assert "_static/mathjax/" in v.page.evaluate(
        "() => document.querySelector('script[src*=\"tex-chtml\"]').src"), "MathJax is not served with the site"


def _quiz_questions(toc_page: TocPage) -> list[dict[str, Any]]:
    path = ROOT / "attnbook" / "quizzes" / f"{toc_page.source.stem}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_quiz_answers_show_feedback(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    if not toc_page.is_notebook:
        pytest.skip("not a chapter")
    page, before = v.page, len(v.errors)
    questions = _quiz_questions(toc_page)
    rendered = page.locator(".Quiz")
    assert rendered.count() == len(questions), (
        f"{v.url}: {rendered.count()} quiz questions rendered, {len(questions)} in the quiz file"
    )
    kinds = {"multiple_choice": "MultipleChoiceQn", "many_choice": "ManyChoiceQn", "numeric": "NumericQn"}
    for i, q in enumerate(questions):  # shuffle_questions is off: the page keeps the file's order
        box = rendered.nth(i)
        assert box.locator(f".{kinds[q['type']]}").count() == 1, f"{v.url} question {i + 1} is not {q['type']}"
        feedback = box.locator(".Feedback")
        assert _norm(feedback.inner_text()) == "", f"{v.url} question {i + 1} shows feedback before any answer"
        if q["type"] == "numeric":
            right = next(a for a in q["answers"] if a.get("correct") and a.get("type") in ("value", "range"))
            typed = right["value"] if right["type"] == "value" else (right["range"][0] + right["range"][1]) / 2
            field = box.locator("input.Input-text")
            field.click()
            field.press_sequentially(str(typed))
            field.press("Enter")
            expected = {_norm(right["feedback"])}
        else:
            button = box.locator(".MCButton").first
            button.click()
            expected = {_norm(a["feedback"]) for a in q["answers"]}
        page.wait_for_function("e => e.textContent.trim().length > 0", arg=feedback.element_handle(), timeout=30_000)
        shown = _norm(feedback.inner_text())
        if q["type"] == "many_choice":  # jupyterquiz appends the count found so far: " [1/2]"
            shown = re.sub(r"\s*\[\d+/\d+\]$", "", shown)
        if not any(c in "".join(expected) for c in "$<\\`*"):  # plain-text feedback: must match the file exactly
            assert shown in expected, f"{v.url} question {i + 1}: feedback {shown!r} is none of {expected}"
        assert feedback.is_visible()
    _no_new_errors(v, before, "answering the quiz")


def test_sliders_change_the_figure(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    page, before = v.page, len(v.errors)
    sliders = page.locator(".attnlib-slider")
    if sliders.count() == 0:
        pytest.skip("no kernel-free slider on this page")
    for i in range(sliders.count()):
        slider = sliders.nth(i)
        slider.scroll_into_view_if_needed()
        frames = slider.locator(".attnlib-frame")
        assert frames.count() >= 2, f"{v.url} slider {i}: only {frames.count()} frame"
        visible = slider.locator(".attnlib-frame:visible")
        assert visible.count() == 1, f"{v.url} slider {i}: {visible.count()} frames visible at once"
        start_index = visible.get_attribute("data-index")
        start_html, start_label = visible.inner_html(), slider.locator(".attnlib-value").inner_text()
        rng = slider.locator("input[type=range]")
        target = "1" if start_index == "0" else "0"
        rng.fill(target)
        visible = slider.locator(".attnlib-frame:visible")
        assert visible.count() == 1 and visible.get_attribute("data-index") == target, (
            f"{v.url} slider {i}: moving it to {target} did not show frame {target}"
        )
        assert visible.inner_html() != start_html, f"{v.url} slider {i}: the figure did not change"
        assert slider.locator(".attnlib-value").inner_text() != start_label, f"{v.url} slider {i}: the label did not change"
    _no_new_errors(v, before, "moving the sliders")


def test_solutions_are_folded_and_open(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    page, before = v.page, len(v.errors)
    solutions = page.locator(".solution.dropdown")
    if not toc_page.is_notebook and solutions.count() == 0:
        pytest.skip("no exercise solutions on this page")
    assert solutions.count() >= 1, f"{v.url}: no folded solution (sphinx-exercise dropdown)"
    for i in range(solutions.count()):
        solution = solutions.nth(i)
        body = solution.locator("section").first
        assert not body.is_visible(), f"{v.url} solution {i + 1} is open before it is clicked"
        # The toggle button that sphinx-togglebutton adds (the title's middle is often the link
        # back to the exercise, which scrolls instead of opening).
        solution.locator(".admonition-title button.toggle-button").click()
        body.wait_for(state="visible", timeout=30_000)
        assert body.inner_text().strip(), f"{v.url} solution {i + 1} opened empty"
    _no_new_errors(v, before, "opening the solutions")


def test_colab_and_download_buttons(visit: tuple[TocPage, Visit]) -> None:
    toc_page, v = visit
    if not toc_page.is_notebook:
        pytest.skip("not a notebook")
    owner_repo = CONFIG["repository"]["url"].rstrip("/").removeprefix("https://github.com/")
    branch = CONFIG["repository"].get("branch", "main")
    expected = f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/{toc_page.source.as_posix()}"
    links = v.page.eval_on_selector_all("a[href*='colab.research.google.com']", "as => as.map(a => a.href)")
    assert links == [expected], f"{v.url}: Colab links {links}, expected [{expected}]"
    downloads = v.page.eval_on_selector_all("a[href$='.ipynb']:not([href*='colab'])", "as => as.map(a => a.href)")
    assert downloads, f"{v.url}: no download-notebook button"
    for href in set(downloads):
        response = v.page.request.get(href)
        assert response.ok, f"{href}: HTTP {response.status}"
        assert json.loads(response.body())["cells"], f"{href} is not the notebook"
