"""The book's structure: every notebook is in the table of contents, executed, and well formed."""

from __future__ import annotations

import json
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
