"""The parts of ``make test-colab`` (tests/colab/run_colab.py) that decide what differs and what fails."""

from __future__ import annotations

import sys

import nbformat
from nbformat.v4 import new_code_cell, new_output
from toc import ROOT

sys.path.insert(0, str(ROOT / "tests" / "colab"))
import run_colab  # noqa: E402

SUBS = run_colab.sanitizers()


def _cell(*outputs: nbformat.NotebookNode, tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    cell = new_code_cell("pass", metadata={"tags": list(tags)})
    cell.outputs = list(outputs)
    return cell


def _stdout(text: str) -> nbformat.NotebookNode:
    return new_output("stream", name="stdout", text=text)


def test_version_strings_and_timings_are_masked_and_nothing_else() -> None:
    stored = _cell(_stdout("transformers 5.24.0, torch 2.13.0+cpu: ~12.3 ms, error 0.493\n"))
    same = _cell(_stdout("transformers 5.15.0, torch 2.11.0: ~40.1 ms, error 0.493\n"))
    other = _cell(_stdout("transformers 5.15.0, torch 2.11.0: ~40.1 ms, error 0.494\n"))
    assert run_colab.comparable(stored, SUBS) == run_colab.comparable(same, SUBS)
    assert run_colab.comparable(stored, SUBS) != run_colab.comparable(other, SUBS)
    for number in ("0.5", "1e-10", "(2, 8, 7, 7)", "3.14"):  # numbers, not versions
        assert run_colab.comparable(_cell(_stdout(number)), SUBS) == [f"[stdout] {number}"]


def test_streams_are_joined_and_html_and_text_compared_but_not_images() -> None:
    split = _cell(_stdout("a\n"), _stdout("b\n"))
    assert run_colab.comparable(split, SUBS) == run_colab.comparable(_cell(_stdout("a\nb\n")), SUBS)
    figure = new_output("display_data", data={"text/plain": "<Figure>", "image/png": "AAAA"})
    redrawn = new_output("display_data", data={"text/plain": "<Figure>", "image/png": "BBBB"})
    assert run_colab.comparable(_cell(figure), SUBS) == run_colab.comparable(_cell(redrawn), SUBS) == ["[text/plain] <Figure>"]
    html = new_output("display_data", data={"text/html": "<b>1</b>", "text/plain": "x"})
    assert run_colab.comparable(_cell(html), SUBS) == ["[text/plain] x", "[text/html] <b>1</b>"]


def test_first_difference_names_both_lines() -> None:
    a = run_colab.comparable(_cell(_stdout("shape (2, 1, 7, 7)\nsame\n")), SUBS)
    b = run_colab.comparable(_cell(_stdout("shape (2, 1, 1, 7)\nsame\n")), SUBS)
    assert run_colab.first_difference(a, b) == "stored '[stdout] shape (2, 1, 7, 7)' | colab '[stdout] shape (2, 1, 1, 7)'"
    assert run_colab.first_difference(a, a) == "identical"
    assert run_colab.first_difference([], b).startswith("stored '(nothing)' | colab '[stdout] shape")


def test_only_the_nbval_ignore_tag_or_marker_skips_a_comparison() -> None:
    assert run_colab.ignored(_cell(tags=("nbval-ignore-output", "remove-output")))
    assert not run_colab.ignored(_cell(tags=("remove-output",)))
    marked = new_code_cell("# NBVAL_IGNORE_OUTPUT: a live widget\nw")
    assert run_colab.ignored(marked)


def test_the_recorded_image_is_pinned_exactly_and_has_no_triton() -> None:
    pins = run_colab.image_pins()
    assert all(str(req.specifier).startswith("==") for req in pins.values()), "every Colab package is pinned exactly"
    assert "triton" not in pins and "tensorflow" not in pins
    for name, version in {"ipython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1", "numpy": "2.1.3",
                          "matplotlib": "3.10.0", "transformers": "5.15.0"}.items():
        assert str(pins[name].specifier) == f"=={version}", f"{name}: {pins[name].specifier}"


def test_the_install_cell_is_found_in_the_chapter_and_under_the_editions_title() -> None:
    source = "\n".join([run_colab.sync_colab.MARKER + " fetch the book", f"!git clone x {run_colab.sync_colab.CLONE_DIR}"])
    assert run_colab.is_colab_cell(new_code_cell(source))
    assert run_colab.is_colab_cell(new_code_cell("# @title Setup: run this cell first\n" + source))
    assert not run_colab.is_colab_cell(new_code_cell("# @title Setup\nimport attnlib"))
    assert not run_colab.is_colab_cell(nbformat.v4.new_markdown_cell(source))
