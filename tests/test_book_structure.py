"""The book's structure: every notebook is in the table of contents, executed, and well formed."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from toc import ROOT, toc_files, toc_notebooks

from attnbook.quiz import validate_quiz

NOTEBOOKS = toc_notebooks()


def test_every_notebook_under_book_is_in_the_toc() -> None:
    on_disk = {p.relative_to(ROOT) for p in (ROOT / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts}
    listed = set(NOTEBOOKS)
    assert on_disk - listed == set(), f"notebooks not listed in _toc.yml: {sorted(map(str, on_disk - listed))}"


def test_toc_pages_exist() -> None:
    assert toc_files()  # raises FileNotFoundError for a missing page


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_notebook_has_stored_outputs_from_a_full_run(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path} has no code cells"
    assert any(c.outputs for c in code), f"{path} has no stored outputs: run tools/execute_notebook.py"
    not_run = [i for i, c in enumerate(code) if c.source.strip() and c.execution_count is None]
    assert not not_run, f"{path}: code cells {not_run} were never executed"
    counts = [c.execution_count for c in code if c.execution_count is not None]
    assert counts == list(range(1, len(counts) + 1)), f"{path} was not executed top to bottom in one run: {counts}"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path} has stored error outputs"
    assert "widgets" not in nb.metadata, f"{path} stores widget state (the website must not show dead widgets)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_chapter_has_the_parts_every_chapter_needs(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for heading in ("Learning objectives", "## Summary", "## Quiz", "## Exercises"):
        assert heading in text, f"{path} lacks a '{heading}' section"
    assert f'show_quiz("{path.stem}")' in code, f"{path} does not show its quiz {path.stem}"
    assert text.count(":::{exercise}") >= 2, f"{path} has fewer than 2 exercises"
    assert text.count(":::{solution-start}") + text.count(":::{solution}") >= 2, f"{path} lacks solutions"
    assert "get_device()" in code, f"{path} does not take its device from attnlib.get_device()"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_quiz_file_is_valid(path: Path) -> None:
    quiz = ROOT / "attnbook" / "quizzes" / f"{path.stem}.json"
    questions = validate_quiz(json.loads(quiz.read_text(encoding="utf-8")), quiz.name)
    assert len(questions) >= 4, f"{quiz.name} has {len(questions)} questions, the book asks for at least 4"
    kinds = {q["type"] for q in questions}
    assert "numeric" in kinds and kinds & {"multiple_choice", "many_choice"}, f"{quiz.name} should mix kinds: {kinds}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_figures_have_alt_text(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if any("image/png" in o.get("data", {}) for o in cell.outputs):
            alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")
            assert len(alt) > 20, f"{path} cell {i} draws a figure without alt text in metadata.mystnb.image.alt"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_markdown_has_no_control_characters(path: Path) -> None:
    # A LaTeX command written through a non-raw Python string ("\text", "\right", "\bmod") turns into a
    # TAB, CR or backspace that silently breaks the formula on the page.
    nb = nbformat.read(ROOT / path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        bad = sorted({hex(ord(ch)) for ch in cell.source if (ord(ch) < 32 and ch != "\n") or ord(ch) == 127})
        assert not bad, f"{path} markdown cell {i} contains control characters {bad}"


# --- Where readers run the notebooks: JupyterLab, Colab, the website ---------------------------------
# tools/sync_notebooks.py writes the metadata below; these tests check the result on their own terms.
GATE_CLOSE = "</div><!-- attnbook-gate -->"

SOLUTION_START = re.compile(r"^:{3,}\{solution-start\}", re.M)
SOLUTION_END = re.compile(r"^:{3,}\{solution-end\}", re.M)


def _without_comments(source: str) -> str:
    """``source`` without its MyST comment lines (``% ...``, not rendered anywhere)."""
    return "\n".join(line for line in source.split("\n") if not line.startswith("%"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_solutions_start_folded_in_jupyterlab_and_colab(path: Path) -> None:
    """Every cell of a solution, from its ``solution-start`` cell to its ``solution-end`` cell, is
    folded where the reader opens it, under a first line that names it.

    JupyterLab folds a cell with ``jupyter.source_hidden`` (and its output with ``outputs_hidden``)
    and shows the first line of what it folds; Colab shows a code cell with ``cellView: form`` as
    its ``# @title`` line and a "Show code" link. The fences are folded too: jupyterlab-myst renders
    each cell alone, so an unfolded ``solution-start`` shows "Start of Solution to Exercise N" and a
    ``solution-end`` an empty box. A folded markdown cell starts with a ``% Solution`` comment, which
    the website and jupyterlab-myst do not render.
    """
    nb = nbformat.read(ROOT / path, as_version=4)
    inside, problems, solutions = False, [], 0
    for i, cell in enumerate(nb.cells):
        where = f"cell {i} ({cell.get('id')})"
        is_start = cell.cell_type == "markdown" and SOLUTION_START.search(cell.source) and not inside
        if is_start:
            solutions += 1
            if _without_comments(cell.source[:SOLUTION_START.search(cell.source).start()]).strip():
                problems.append(f"{where}: text before solution-start shares the cell (it would be folded with it)")
            inside = True
        if not inside:
            continue
        if cell.cell_type == "markdown" and SOLUTION_END.search(cell.source):
            inside = False
            after = cell.source[SOLUTION_END.search(cell.source).end():].split("\n", 2)[2:]  # after the fence's closing line
            # (the HTML that wraps the fence for JupyterLab, tools/sync_notebooks.py's GATE_CLOSE, closes after it)
            if "".join(after).replace(GATE_CLOSE, "").strip():
                problems.append(f"{where}: text after solution-end shares the cell (it would be folded with the solution)")
        jupyter = cell.metadata.get("jupyter", {})
        if not jupyter.get("source_hidden"):
            problems.append(f"{where}: a solution cell without jupyter.source_hidden (JupyterLab shows it unfolded)")
        if cell.cell_type == "code":
            if not jupyter.get("outputs_hidden"):
                problems.append(f"{where}: a solution's output without jupyter.outputs_hidden")
            if cell.metadata.get("cellView") != "form" or not cell.source.startswith("# @title Solution"):
                problems.append(f"{where}: a solution's code without Colab's form view (cellView: form and a '# @title Solution' line)")
        elif not cell.source.startswith("% Solution"):
            problems.append(f"{where}: folded solution text must start with a '% Solution' comment (JupyterLab shows the first line of a folded cell)")
    assert not inside, f"{path}: a solution-start has no solution-end"
    assert solutions >= 2, f"{path}: {solutions} solutions found"
    assert not problems, f"{path}: run tools/sync_notebooks.py\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_notebook_opens_unmodified_in_jupyterlab(path: Path) -> None:
    """JupyterLab writes ipykernel's kernelspec when its kernel starts, and ``collapsed: true`` beside
    ``jupyter.outputs_hidden``: stored otherwise, a notebook is marked modified as soon as it opens."""
    nb = nbformat.read(ROOT / path, as_version=4)
    spec = nb.metadata.get("kernelspec")
    assert spec == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}, spec
    odd = [i for i, c in enumerate(nb.cells)
           if bool(c.metadata.get("jupyter", {}).get("outputs_hidden")) != bool(c.metadata.get("collapsed"))]
    assert not odd, f"{path}: cells {odd} differ in jupyter.outputs_hidden and collapsed; run tools/sync_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_jupyterlab_shows_the_chapter_not_the_website_scaffolding(path: Path) -> None:
    """The Colab cell is folded; a live slider stores its note, not the widget (whose repr JupyterLab
    would show before the cell runs); the glossary terms the chapter uses are defined in its last cell
    (for jupyterlab-myst; removed on the website)."""
    from attnbook.slider import LIVE_NOTE

    nb = nbformat.read(ROOT / path, as_version=4)
    assert nb.cells[0].metadata.get("jupyter", {}).get("source_hidden"), f"{path}: the Colab cell is not folded"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "live_slider(" in cell.source and cell.outputs:
            shown = [o.get("data", {}).get("text/plain", o.get("text", "")) for o in cell.outputs]
            assert shown[-1] == LIVE_NOTE, f"{path} cell {i}: a live slider stores {shown!r}"
            assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.outputs)
    used = {t.lower() for c in nb.cells[:-1] if c.cell_type == "markdown"
            for t in re.findall(r"\{term\}`(?:[^`<]*<)?([^`<>]+?)>?`", c.source)}
    if used:
        last = nb.cells[-1]
        assert last.cell_type == "markdown" and "remove-cell" in last.metadata.get("tags", []), f"{path}: no glossary cell"
        defined = {t.lower() for t in re.findall(r"^([^\s:].*)\n: ", last.source, re.M)}
        assert used <= defined, f"{path}: terms without a definition in the glossary cell: {sorted(used - defined)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_exercise_labels_carry_their_chapter_number(path: Path) -> None:
    """Labels are global on the website: ``ex-NN-...`` in chapter NN keeps them unique after a renumbering."""
    text = (ROOT / path).read_text(encoding="utf-8")
    labels = set(re.findall(r":label: (ex-[\w-]+)", text))
    chapter = path.name[:2]
    assert labels and all(label.startswith(f"ex-{chapter}-") for label in labels), sorted(labels)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_solution_code_prints_nothing(path: Path) -> None:
    """A solution's code runs (so ``make test`` checks it against its checker) and stays silent.

    Run All runs the solutions too, and JupyterLab and Colab show a folded cell's new outputs: a
    solution that printed would show every answer under its exercise. What a reader should see
    after opening a solution is written in its folded prose; the code asserts it instead.
    """
    nb = nbformat.read(ROOT / path, as_version=4)
    noisy = [f"cell {i} ({cell.get('id')})" for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and cell.source.startswith("# @title Solution") and cell.outputs]
    assert not noisy, f"{path}: solution cells with outputs: {noisy}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_cells_that_only_feed_a_static_slider_fold_their_code_on_the_website(path: Path) -> None:
    """A cell that calls ``static_slider`` and defines no function (its settings, title, alt text) is
    tagged ``hide-input``: the website shows the figure with the code behind "Show code cell source"."""
    nb = nbformat.read(ROOT / path, as_version=4)
    unfolded = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "static_slider(" not in cell.source:
            continue
        tree = ast.parse(cell.source)
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree)):
            continue
        if "hide-input" not in cell.metadata.get("tags", []):
            unfolded.append(i)
    assert not unfolded, f"{path}: cells {unfolded} only feed a static slider but show their code; run tools/sync_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_notebook_metadata_is_synced(path: Path) -> None:
    """tools/sync_notebooks.py would change nothing (it is idempotent, so after a merge it is simply re-run)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import sync_notebooks

    nb = nbformat.read(ROOT / path, as_version=4)
    assert not sync_notebooks.sync(nb), f"{path}: run tools/sync_notebooks.py"


CODE_FROM = re.compile(r'^<!-- code from (\S+), from "([^"]+)" to "([^"]+)" -->\n```python\n(.*?)^```$', re.M | re.S)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_code_shown_from_the_library_equals_its_source(path: Path) -> None:
    """A fenced block marked ``<!-- code from FILE, from "A" to "B" -->`` holds exactly those lines of FILE,
    and no page uses ``literalinclude``, which Colab shows as raw text and JupyterLab does not resolve."""
    nb = nbformat.read(ROOT / path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        assert "literalinclude" not in cell.source, f"{path} cell {i}: show the code in a marked fenced block instead"
        assert cell.source.count("<!-- code from ") == len(CODE_FROM.findall(cell.source)), \
            f"{path} cell {i}: a code-from marker is not directly followed by a ```python block"
        for file, start, end, body in CODE_FROM.findall(cell.source):
            lines = (ROOT / path).parent.joinpath(file).read_text().splitlines()
            first = next(k for k, line in enumerate(lines) if start in line)
            last = next(k for k in range(first, len(lines)) if end in lines[k])
            assert body == "\n".join(lines[first:last + 1]) + "\n", \
                f"{path} cell {i}: the code from {file} differs from the source; run tools/sync_notebooks.py"


def test_sync_notebooks_rewrites_a_stale_code_block(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import sync_notebooks

    (tmp_path / "lib.py").write_text("def f(x):\n    y = x + 1\n    return y\n\nz = 3\n")
    marker = '<!-- code from lib.py, from "y = x" to "return" -->\n```python\n'
    cell = f"Text before.\n\n{marker}    y = x + 2  # stale\n```\n\nText after."
    synced = sync_notebooks.sync_code_from(cell, tmp_path)
    assert synced == f"Text before.\n\n{marker}    y = x + 1\n    return y\n```\n\nText after."
    assert sync_notebooks.sync_code_from(synced, tmp_path) == synced  # idempotent
    with pytest.raises(ValueError, match="no line containing"):
        sync_notebooks.sync_code_from(cell.replace("y = x", "w = x", 1), tmp_path)


def test_live_slider_stores_its_note_not_the_widget_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a live slider's cell stores as the widget's text form is its note (JupyterLab shows the
    text form of a widget it cannot draw, e.g. ``interactive(children=(FloatLogSlider(...``)."""
    from attnbook import Frame, Panel, live_slider
    from attnbook.slider import LIVE_NOTE

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append((obj, k)))
    live_slider(lambda t: Frame(f"t = {t}", [Panel([[t]])]), t=(1, 3))
    bundles = [obj for obj, k in shown if k.get("raw") and "application/vnd.jupyter.widget-view+json" in obj]
    assert len(bundles) == 1 and bundles[0]["text/plain"] == LIVE_NOTE, shown
