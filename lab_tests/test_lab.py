"""Every chapter of ``_toc.yml`` in JupyterLab, as a reader meets it (``make test-lab``).

Each chapter is opened once (a module-scoped fixture per chapter), untrusted, as a fresh download
is; the tests below then look at it in order:

1. the markdown is rendered as MyST (no raw ``:::{`` fences or ``{term}`` roles on screen);
2. every solution starts folded;
3. before anything has run, the quiz and the static sliders say "Run this cell" and their
   controls are disabled rather than dead;
4. Run All finishes with no error and nothing on stderr (the time it takes is recorded);
5. the static sliders now work and move with the arrow keys, which JupyterLab's command mode
   would otherwise take;
6. every live control (ipywidgets slider or dropdown) moves with the keyboard, redraws, and each
   redraw for a setting that the static slider after it also shows is exactly that frame;
7. the quiz answers from the keyboard.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
from attnbook.quiz import visible_text
from labkit import OUTPUTS, ROOT, RUN_ALL, Lab, Notebook, open_notebook, record, toc_notebooks

NOTEBOOKS: list[Path] = toc_notebooks()
SOLUTION_START = re.compile(r"^:{3,}\{solution-start\}", re.M)
SOLUTION_END = re.compile(r"^:{3,}\{solution-end\}", re.M)
#: MyST that was not rendered: a directive fence or a role such as {term}`x` left as text.
RAW_MYST = re.compile(r":::\s*\{[a-z-]+\}|```\s*\{[a-z-]+\}|\{[a-z][a-z:-]*\}`")


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def chapter(request: pytest.FixtureRequest, browser: Any, lab: Lab) -> Iterator[tuple[Any, Notebook]]:
    path: Path = request.param
    nb = nbformat.read(ROOT / path, as_version=4)
    start = time.perf_counter()
    opened = open_notebook(browser, lab, path.name)
    record(path.stem, open_s=round(time.perf_counter() - start, 1))
    yield nb, opened
    opened.page.context.close()
    lab.api(f"sessions/{_session_id(lab, path.name)}", method="DELETE")  # its kernel stops


def _session_id(lab: Lab, name: str) -> str:
    return next(s["id"] for s in lab.api("sessions") if s["path"].endswith(name))


def _cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def _solution_cells(nb: Any) -> list[tuple[int, str]]:
    """``(index, role)`` of every cell of a solution: ``start``, ``folded`` or ``end-fence``."""
    cells, inside = [], False
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and SOLUTION_START.search(cell.source) and not inside:
            cells.append((i, "start"))
            inside = not SOLUTION_END.search(cell.source)
        elif inside:
            end = cell.cell_type == "markdown" and SOLUTION_END.search(cell.source)
            only_fence = end and not SOLUTION_END.sub("", cell.source).replace(":", "").strip()
            cells.append((i, "end-fence" if only_fence else "folded"))
            inside = not end
    return cells


def test_markdown_is_rendered_as_myst(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page = opened.page
    markdown = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    # jupyterlab-myst renders each cell asynchronously: wait until every markdown cell has.
    page.wait_for_function(
        """n => document.querySelectorAll('.jp-Notebook .jp-MarkdownCell.jp-mod-rendered').length >= n""", arg=len(markdown))
    raw, shown = [], 0
    for i in markdown:
        # What the reader sees: the rendered cell (jupyterlab-myst's, or JupyterLab's own without
        # it), not the hidden editor that holds the source.
        rendered = _cell(page, i).locator(".jp-InputArea > :not(.jp-InputArea-editor):not(.jp-InputArea-prompt)")
        if not rendered.count() or not rendered.first.is_visible():
            continue  # a folded cell (checked by the next test)
        text = rendered.first.inner_text()
        shown += bool(text.strip())
        for match in RAW_MYST.finditer(text):
            raw.append(f"cell {i}: {text[max(0, match.start() - 30):match.end() + 30]!r}")
    assert shown >= len(markdown) // 2, f"{opened.name}: only {shown} of {len(markdown)} markdown cells show any text"
    assert not raw, f"{opened.name}: MyST shown as raw text in JupyterLab:\n" + "\n".join(raw)
    exercises = page.locator(".jp-Notebook .myst-exercise")
    assert exercises.count() >= 2, f"{opened.name}: the exercises are not drawn as exercise boxes (is jupyterlab-myst installed?)"


def test_solutions_start_folded(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page, problems = opened.page, []
    solutions = _solution_cells(nb)
    assert sum(role == "start" for _, role in solutions) >= 2, f"{opened.name}: fewer than 2 solutions"
    for i, role in solutions:
        cell = _cell(page, i)
        if role == "start":
            # jupyterlab-myst draws it as a dropdown "Solution to Exercise N" that starts closed.
            title = cell.get_by_text(re.compile("Solution to"))
            if not title.count() or not title.first.is_visible():
                problems.append(f"cell {i}: the solution's dropdown has no visible title 'Solution to ...'")
            after = SOLUTION_START.split(nb.cells[i].source, 1)[1].split("\n:::", 1)[-1].strip()
            words = re.sub(r"[`$*\\{}_]", "", after.split("\n", 1)[0])[:40].strip()
            if words and cell.get_by_text(words, exact=False).count() and cell.get_by_text(words, exact=False).first.is_visible():
                problems.append(f"cell {i}: the solution's text {words!r} shows before the dropdown is opened")
        elif role == "folded":
            placeholder = cell.locator(".jp-InputPlaceholder")
            if not placeholder.count() or not placeholder.is_visible():
                problems.append(f"cell {i}: a solution cell is not folded")
            elif not re.match(r"(# @title |% )Solution", placeholder.inner_text().strip()):
                problems.append(f"cell {i}: a folded solution cell shows {placeholder.inner_text()[:60]!r}")
            if cell.locator(".jp-Cell-outputArea").count() and cell.locator(".jp-Cell-outputArea").first.is_visible():
                problems.append(f"cell {i}: a folded solution's output is visible")
    assert not problems, f"{opened.name}:\n" + "\n".join(problems)


def test_before_running_the_quiz_and_sliders_say_run_this_cell(chapter: tuple[Any, Notebook]) -> None:
    _, opened = chapter
    page = opened.page
    boxes = page.locator(".attnlib-slider, .attnbook-quiz")
    assert page.locator(".attnbook-quiz").count() == 1, f"{opened.name}: no quiz on the page"
    for k in range(boxes.count()):
        box = boxes.nth(k)
        box.scroll_into_view_if_needed()
        note = box.locator(".attnlib-note, .aq-note")
        assert note.count() == 1 and note.is_visible(), f"{opened.name}: widget {k} does not say what to do before it has run"
        assert note.inner_text().startswith("Run this cell"), note.inner_text()
        enabled = box.locator("input:enabled, button:enabled")
        assert enabled.count() == 0, f"{opened.name}: widget {k} shows {enabled.count()} live-looking controls that do nothing yet"


def test_run_all_without_errors(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page = opened.page
    start = time.perf_counter()
    page.evaluate(RUN_ALL)
    seconds = time.perf_counter() - start
    record(opened.name.removesuffix(".ipynb"), run_all_s=round(seconds, 1))
    problems = []
    for i, outputs in enumerate(page.evaluate(OUTPUTS)):
        for out in outputs or []:
            if out["output_type"] == "error":
                problems.append(f"cell {i}: {out['ename']}: {out['evalue']}")
            elif out["output_type"] == "stream" and out["name"] == "stderr":
                problems.append(f"cell {i} wrote to stderr: {''.join(out['text'])[:300]!r}")
    assert not problems, f"{opened.name} after Run All:\n" + "\n".join(problems)
    # Their scripts have now run: the notes are gone and the controls work.
    assert page.locator(".attnlib-note, .aq-note").count() == 0, f"{opened.name}: a 'Run this cell' note stayed after Run All"
    assert page.locator(".attnbook-quiz button:disabled, .attnlib-slider input:disabled").count() == 0
    assert not opened.errors, f"{opened.name}: uncaught errors in the page: {opened.errors}"


def _active_cell(page: Any) -> int:
    return page.evaluate("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex")


def test_static_sliders_move_with_the_arrow_keys(chapter: tuple[Any, Notebook]) -> None:
    _, opened = chapter
    page = opened.page
    sliders = page.locator(".attnlib-slider")
    if sliders.count() == 0:
        pytest.skip("no static slider in this chapter")
    for k in range(sliders.count()):
        slider = sliders.nth(k)
        page.wait_for_function("s => s.dataset.ready === '1'", arg=slider.element_handle())
        rng, box = slider.locator("input[type=range]"), slider.locator(".attnlib-frame")
        start, top = int(rng.input_value()), int(rng.get_attribute("max"))
        rng.focus()
        cell = _active_cell(page)
        key, expected = ("ArrowRight", start + 1) if start < top else ("ArrowLeft", start - 1)
        page.keyboard.press(key)
        where = f"{opened.name} static slider {k}"
        assert int(rng.input_value()) == expected, f"{where}: {key} moved it from {start} to {rng.input_value()}, not {expected}"
        page.wait_for_function(f"b => b.dataset.index === '{expected}'", arg=box.element_handle())
        assert page.evaluate("() => document.activeElement.type") == "range", f"{where}: {key} took the focus away"
        assert _active_cell(page) == cell, f"{where}: {key} also moved JupyterLab to another cell"
        page.keyboard.press("ArrowLeft" if key == "ArrowRight" else "ArrowRight")
        assert int(rng.input_value()) == start


# --- Live sliders against their static twins ------------------------------------------------------------

def _static_frames(page: Any, slider: Any) -> list[dict[str, Any]]:
    """The frames of a static slider, from the data it carries: each with ``a``, its setting."""
    packed = slider.locator("script.attnlib-data").evaluate("s => s.textContent")
    return json.loads(gzip.decompress(base64.b64decode(packed)))["f"]


def _same_setting(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) and not isinstance(y, bool):
            if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif x != y:
            return False
    return True


def _live_cells(nb: Any) -> list[tuple[int, int]]:
    """``(live cell, static cell)``: each live slider and the static slider after it (its twin)."""
    pairs = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "live_slider(" in cell.source:
            twin = next((j for j in range(i + 1, len(nb.cells))
                         if nb.cells[j].cell_type == "code" and "static_slider(" in nb.cells[j].source), None)
            assert twin is not None, f"cell {i}: a live slider with no static slider after it"
            pairs.append((i, twin))
    return pairs


#: The live controls the test moves, and the keys that move them: from the start to the end,
#: a few steps in between (a dropdown steps down, a slider right).
CONTROLS = {".widget-slider .noUi-handle": ["Home", *["ArrowRight"] * 5, "End"],
            ".widget-dropdown select": ["Home", *["ArrowDown"] * 5, "End"]}
#: True once the live slider in cell ``i`` has drawn a setting other than ``s`` (each redraw is a new element).
REDRAWN = """([i, s]) => { const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[i];
  const drawn = cell && cell.querySelector('.attnlib-frame[data-setting]');
  return drawn !== null && drawn.getAttribute('data-setting') !== s; }"""
CONTROL_VALUE = """e => e.tagName === 'SELECT' ? e.value : e.getAttribute('aria-valuenow')"""


def test_live_controls_follow_the_keyboard_and_match_the_static_frames(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page = opened.page
    pairs = _live_cells(nb)
    if not pairs:
        pytest.skip("no live slider in this chapter")
    report = []
    for live_index, static_index in pairs:
        live, static = _cell(page, live_index), _cell(page, static_index).locator(".attnlib-slider")
        frames = _static_frames(page, static)
        rng, static_box = static.locator("input[type=range]"), static.locator(".attnlib-frame")
        start = rng.input_value()
        drawn = live.locator(".attnlib-frame[data-setting]")
        drawn.wait_for()
        compared, moves = 0, 0
        for selector, keys in CONTROLS.items():
            for c in range(live.locator(selector).count()):
                control = live.locator(selector).nth(c)
                for key in keys:
                    before_value, before = control.evaluate(CONTROL_VALUE), drawn.get_attribute("data-setting")
                    control.focus()
                    cell = _active_cell(page)
                    page.keyboard.press(key)
                    where = f"{opened.name} cell {live_index} control {selector} #{c} after {key}"
                    assert _active_cell(page) == cell, f"{where}: the key moved JupyterLab to another cell"
                    if control.evaluate(CONTROL_VALUE) == before_value:
                        continue  # already at that end
                    moves += 1
                    page.wait_for_function(REDRAWN, arg=[live_index, before], timeout=120_000)
                    setting = json.loads(drawn.get_attribute("data-setting"))
                    k = next((k for k, f in enumerate(frames) if _same_setting(f["a"], setting)), None)
                    if k is None:
                        continue  # the static slider does not show this setting
                    rng.fill(str(k))
                    page.wait_for_function(f"b => b.dataset.index === '{k}'", arg=static_box.element_handle())
                    assert drawn.inner_html() == static_box.inner_html(), (
                        f"{where}: the live redraw for {setting} differs from the static slider's frame {k}\n"
                        f"live:   {drawn.inner_html()[:600]}\nstatic: {static_box.inner_html()[:600]}")
                    compared += 1
        rng.fill(start)
        assert moves > 0, f"{opened.name} cell {live_index}: no live control moved with the keyboard"
        assert compared > 0, f"{opened.name} cell {live_index}: no live redraw could be compared with the static slider"
        report.append({"cell": live_index, "moves": moves, "compared": compared})
    record(opened.name.removesuffix(".ipynb"), live=report)
    assert not opened.errors, f"{opened.name}: uncaught errors in the page: {opened.errors}"


def test_quiz_answers_from_the_keyboard(chapter: tuple[Any, Notebook]) -> None:
    _, opened = chapter
    page = opened.page
    questions = json.loads((ROOT / "attnbook" / "quizzes" / f"{Path(opened.name).stem}.json").read_text(encoding="utf-8"))
    boxes = page.locator(".attnbook-quiz .aq-q")
    assert boxes.count() == len(questions)
    answered = set()
    for i, q in enumerate(questions):
        if q["type"] in answered:
            continue  # one question of each kind
        box, where = boxes.nth(i), f"{opened.name} quiz question {i + 1}"
        feedback = box.locator(".aq-fb")
        if q["type"] == "numeric":
            right = next(a for a in q["answers"] if a.get("correct") and a.get("type") in ("value", "range"))
            typed = right["value"] if right["type"] == "value" else (right["range"][0] + right["range"][1]) / 2
            field = box.locator("input")
            field.focus()
            page.keyboard.type(str(typed))
            page.keyboard.press("Enter")
            expected = "Correct. " + right["feedback"]
        else:
            button = box.locator(".aq-opts button").first
            button.focus()
            page.keyboard.press("Enter")
            answer = q["answers"][int(button.get_attribute("data-a"))]
            expected = ("Correct. " if answer.get("correct") else "Not quite. ") + answer["feedback"]
        norm = lambda t: " ".join(t.split())  # noqa: E731
        expected = visible_text(expected)  # the widget shows feedback typeset (attnbook.quiz.typeset)
        assert norm(feedback.inner_text()).startswith(norm(expected)[:80]), f"{where}: feedback {feedback.inner_text()!r}"
        answered.add(q["type"])
    assert "numeric" in answered and len(answered) >= 2
