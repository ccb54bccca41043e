"""Every chapter of ``_toc.yml`` in JupyterLab, as a reader meets it (``make test-lab``).

Each chapter is opened once (a module-scoped fixture per chapter), untrusted, as a fresh download
is; the tests below then look at it in order:

1. opening it changes nothing (JupyterLab marks no change to save);
2. the Colab install cell is folded to one line above the chapter's title;
3. the markdown is rendered as MyST (no raw ``:::{`` fences or ``{term}`` roles on screen), and the
   exercises are numbered per chapter ("Exercise 3.1"), as on the website;
4. glossary links resolve: every ``{term}`` link points at a definition on the page, and no
   console error comes from a reference (console errors are counted per chapter);
5. every solution starts folded and reads as a solution: each of its cells folded under a line
   that names it, no "Start of"/"End of" gate titles and no empty boxes; after Run All (which
   unfolds every markdown cell) its written part stays in a closed "Show the solution" dropdown;
6. before anything has run, the quiz and the static sliders say "Run this cell" and their
   controls are disabled rather than dead, and a live slider shows its note, not a widget repr;
7. Run All finishes with no error and nothing on stderr (the time it takes is recorded), shows no
   solution output, and each slider once: the static twin of a live slider is folded;
8. the static sliders now work and move with the arrow keys, which JupyterLab's command mode
   would otherwise take;
9. every live control (ipywidgets slider or dropdown) moves with the keyboard, redraws, and each
   redraw for a setting that the static slider after it also shows is exactly that frame;
10. the quiz answers from the keyboard.

``lab_tests/test_make_lab.py`` checks that ``make lab`` serves a working copy, not ``book/``.
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
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from attnbook.slider import LIVE_NOTE, TWIN_SHOW
from labkit import DIRTY, OUTPUTS, ROOT, RUN_ALL, Lab, Notebook, open_notebook, record, toc_notebooks

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


def test_opening_changes_nothing(chapter: tuple[Any, Notebook]) -> None:
    """A notebook opened and left alone has nothing to save (JupyterLab marked every chapter
    modified two seconds after opening when the stored metadata differed from what it writes)."""
    _, opened = chapter
    time.sleep(4)
    assert not opened.page.evaluate(DIRTY), (
        f"{opened.name}: marked modified right after opening; compare the notebook model with the file "
        "(tools/sync_notebooks.py: kernelspec, collapsed)")


def test_colab_cell_is_folded_above_the_title(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page = opened.page
    assert nb.cells[0].cell_type == "code" and nb.cells[0].source.startswith("# Colab only:")
    cell = _cell(page, 0)
    placeholder = cell.locator(".jp-InputPlaceholder")
    assert placeholder.count() and placeholder.is_visible(), f"{opened.name}: the Colab cell is not folded"
    assert placeholder.inner_text().strip().startswith("# Colab only:"), placeholder.inner_text()
    editor = cell.locator(".jp-InputArea-editor")
    assert not (editor.count() and editor.first.is_visible()), f"{opened.name}: the Colab cell's code shows"
    title = _cell(page, 1).locator("h1")
    assert title.count() and re.match(r"\d+\. ", title.first.inner_text()), f"{opened.name}: no chapter title after the Colab cell"


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
    # Numbered per chapter, "Exercise 3.1", as on the website and in the Colab edition.
    chapter_number = int(opened.name[:2])
    titles = [exercises.nth(k).inner_text().strip().split("\n")[0] for k in range(exercises.count())]
    numbers = [m.group(1) if (m := re.match(r"Exercise (\S+)", t)) else t for t in titles]
    assert numbers == [f"{chapter_number}.{k}" for k in range(1, len(titles) + 1)], f"{opened.name}: exercises read {titles}"


#: Console errors that come from a reference jupyterlab-myst could not resolve ({term}, {ref}, ...).
REFERENCE_ERROR = re.compile(r"Cross reference target was not found|reference target", re.I)
#: The titles jupyterlab-myst gives a solution-start or solution-end gate it cannot join.
GATE_TITLE = re.compile(r"^\s*(Start|End) of (Solution|Exercise)", re.M)


def test_glossary_links_resolve(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page = opened.page
    record(opened.name.removesuffix(".ipynb"), console_errors=len(opened.console))
    unresolved = [e for e in opened.console if REFERENCE_ERROR.search(e)]
    assert not unresolved, (f"{opened.name}: {len(unresolved)} console errors from unresolved references "
                            f"(of {len(opened.console)} console errors), e.g. {unresolved[0][:300]!r}")
    terms = sum(len(re.findall(r"\{term\}`", c.source)) for c in nb.cells if c.cell_type == "markdown")
    links = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-MarkdownCell a.hover-link'))
        .filter(a => (a.getAttribute('href') || '').startsWith('#term-'))
        .map(a => [a.textContent, a.getAttribute('href'), document.getElementById(a.getAttribute('href').slice(1)) !== null])""")
    # Every term shown as a link whose target is on the page (the chapter's glossary cell).
    assert len(links) >= terms > 0 or terms == 0, f"{opened.name}: {terms} term roles but {len(links)} term links"
    dead = [f"{text!r} -> {href}" for text, href, found in links if not found]
    assert not dead, f"{opened.name}: term links with no definition on the page: {dead[:10]}"


def test_solutions_are_folded_and_read_as_solutions(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
    page, problems = opened.page, []
    solutions = _solution_cells(nb)
    assert sum(role == "start" for _, role in solutions) >= 2, f"{opened.name}: fewer than 2 solutions"
    for i, role in solutions:
        cell = _cell(page, i)
        # Every cell of a solution, its start and end fences too, is one folded line that names it.
        placeholder = cell.locator(".jp-InputPlaceholder")
        if not placeholder.count() or not placeholder.is_visible():
            problems.append(f"cell {i} ({role}): a solution cell is not folded")
        elif not re.match(r"(# @title |% )Solution", placeholder.inner_text().strip()):
            problems.append(f"cell {i} ({role}): a folded solution cell shows {placeholder.inner_text()[:60]!r}")
        if cell.locator(".jp-Cell-outputArea").count() and cell.locator(".jp-Cell-outputArea").first.is_visible():
            if cell.locator(".jp-Cell-outputArea").first.inner_text().strip():
                problems.append(f"cell {i}: a folded solution's output is visible")
    # Nowhere a gate's own title ("Start of Solution to Exercise 1") or an empty box.
    rendered = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map((c, i) => {
        if (!c.classList.contains('jp-MarkdownCell')) return null;
        const r = c.querySelector('.jp-InputArea > :not(.jp-InputArea-editor):not(.jp-InputArea-prompt):not(.jp-InputPlaceholder)');
        if (!r || r.offsetParent === null) return null;
        return [i, r.innerText, r.querySelectorAll('aside, .admonition, details, [class*=admonition]').length,
                r.querySelectorAll('img, svg, .MathJax, mjx-container, .katex').length]; })""")
    for item in rendered:
        if item is None:
            continue
        i, text, boxes, pictures = item
        if GATE_TITLE.search(text):
            problems.append(f"cell {i}: shows a gate title {GATE_TITLE.search(text).group().strip()!r}")
        if not text.strip() and not pictures:
            problems.append(f"cell {i}: a markdown cell renders as an empty box" if boxes else f"cell {i}: renders nothing")
    assert not problems, f"{opened.name}:\n" + "\n".join(problems)


def test_before_running_the_quiz_and_sliders_say_run_this_cell(chapter: tuple[Any, Notebook]) -> None:
    nb, opened = chapter
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
    # A live slider's stored output is its note, never the widget's repr.
    reprs = page.locator(".jp-Notebook .jp-OutputArea-output").filter(has_text=re.compile(r"interactive\(children=|\w+Slider\(value="))
    assert reprs.count() == 0, f"{opened.name}: a stored widget repr is shown: {reprs.first.inner_text()[:120]!r}"
    for live_index, _ in _live_cells(nb):
        output = _cell(page, live_index).locator(".jp-OutputArea-output")
        assert output.count() == 1 and output.first.inner_text().strip() == LIVE_NOTE, (
            f"{opened.name} cell {live_index}: the live slider shows {output.all_inner_texts()!r} before it has run")


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
    # Run All ran the solutions too, and shows none of their outputs (a printed answer would sit
    # right under its exercise).
    outputs = page.evaluate(OUTPUTS)
    shown = [f"cell {i}: {json.dumps(outputs[i])[:200]}" for i, role in _solution_cells(nb)
             if nb.cells[i].cell_type == "code" and outputs[i]]
    assert not shown, f"{opened.name}: solution output after Run All:\n" + "\n".join(shown)
    # Each slider once: a static slider whose live twin is drawn is folded behind one button.
    for live_index, static_index in _live_cells(nb):
        live, static = _cell(page, live_index), _cell(page, static_index).locator(".attnlib-slider")
        live.locator(".attnlib-frame[data-setting]").wait_for()
        where = f"{opened.name} cells {live_index} and {static_index}"
        button = static.locator(".attnlib-twin-label")
        try:
            button.wait_for(timeout=10_000)
        except PlaywrightTimeout:
            pytest.fail(f"{where}: the figure shows twice (the static twin of a drawn live slider is not folded)")
        assert button.inner_text() == TWIN_SHOW, f"{where}: the static twin's fold says {button.inner_text()!r}"
        assert not static.locator(".attnlib-frame").is_visible(), f"{where}: the figure shows twice (live and static)"


#: What a solution's markdown cell may show once Run All has rendered it (tools/sync_notebooks.py):
#: its text folded in a closed dropdown, and jupyterlab-myst's own closed dropdown for the
#: ``solution-start`` fence, which holds nothing.
SHOWN_AFTER_RUN_ALL = re.compile(r"Show the solution|Start of Solution to Exercise\s*\d+(?:\.\d+)*")


def test_solutions_stay_folded_after_run_all(chapter: tuple[Any, Notebook]) -> None:
    """JupyterLab's Run All renders every markdown cell and sets inputHidden = false on it
    (@jupyterlab/notebook runCell), which unfolds a solution's markdown cells: only a fold in the
    cell's own text keeps its written part shut, and a ``solution-end`` fence must draw no empty box."""
    nb, opened = chapter
    page = opened.page
    shown = []
    for i, role in _solution_cells(nb):
        if nb.cells[i].cell_type != "markdown":
            continue
        cell = _cell(page, i)
        placeholder = cell.locator(".jp-InputPlaceholder")
        if placeholder.count() and placeholder.is_visible():
            continue  # still folded
        rendered = cell.locator(".jp-InputArea > :not(.jp-InputArea-editor):not(.jp-InputArea-prompt):not(.jp-InputPlaceholder)")
        # innerText leaves out what a closed <details> holds: this is what the reader sees.
        text = rendered.first.inner_text() if rendered.count() else ""
        rest = SHOWN_AFTER_RUN_ALL.sub("", text).strip()
        if rest:
            shown.append(f"cell {i} ({role}) shows {rest[:80]!r}")
        if cell.locator("details[open]").count():
            shown.append(f"cell {i} ({role}): a fold is open")
        boxes = cell.locator("aside, .admonition, [class*=myst-exercise], [class*=myst-admonition]")
        if not text.strip() and any(boxes.nth(k).is_visible() for k in range(boxes.count())):
            shown.append(f"cell {i} ({role}): an empty box")
    assert not shown, f"{opened.name}: solution cells after Run All:\n" + "\n".join(shown)


def _unfold_twin(slider: Any) -> None:
    """Open a static slider that is folded because its live twin is on the page."""
    if slider.evaluate("s => s.classList.contains('attnlib-twin') && !s.classList.contains('attnlib-open')"):
        slider.locator(".attnlib-twin-label").click()


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
        _unfold_twin(slider)
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
        _unfold_twin(static)
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
