"""The Colab edition (``colab/``, ``tools/colab_edition.py``): in step with the chapters, rendered cleanly.

Each chapter's edition must equal what the generator writes from the chapter now (else: run
tools/colab_edition.py), and pass ``tests/colab/check_edition.py`` (what ``make test-colab`` checks
first): no raw MyST in the markdown as Colab renders it, every written solution folded in
``<details>``, every solution's code and the setup cell in form view. The translation itself and
the checker are tested on small planted cells, each checker rule on a cell that breaks it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest
from toc import ROOT, toc_notebooks

sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests" / "colab"))
import check_edition  # noqa: E402
import colab_edition  # noqa: E402

NOTEBOOKS = toc_notebooks()
BOOK = colab_edition.Book.read()


@pytest.fixture(scope="module")
def files() -> dict[Path, str]:
    return colab_edition.build()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_edition_is_in_step_with_the_chapter(path: Path, files: dict[Path, str]) -> None:
    edition = colab_edition.edition_path(path)
    assert (ROOT / edition).is_file(), f"{edition} is missing: run tools/colab_edition.py"
    assert (ROOT / edition).read_text(encoding="utf-8") == files[edition], (
        f"{edition} is out of step with {path}: run tools/colab_edition.py"
    )


def test_readme_links_and_no_stray_notebooks(files: dict[Path, str]) -> None:
    assert colab_edition.stale(files) == [], "the Colab edition or README.md's links are out of step: run tools/colab_edition.py"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"https://colab\.research\.google\.com/github/\S+?\.ipynb", readme)
    assert links == [colab_edition.colab_url(colab_edition.edition_path(p)) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_edition_renders_cleanly_in_colab(path: Path) -> None:
    edition = nbformat.read(ROOT / colab_edition.edition_path(path), as_version=4)
    book = nbformat.read(ROOT / path, as_version=4)
    assert check_edition.notebook_problems(edition, book) == []
    # Code and outputs are the chapter's, cell for cell (titles aside).
    book_code = [c for c in book.cells if c.cell_type == "code"]
    new_code = [c for c in edition.cells if c.cell_type == "code"]
    assert [c.outputs for c in new_code] == [c.outputs for c in book_code]
    strip = lambda s: "\n".join(line for line in s.split("\n") if not line.startswith("# @title "))  # noqa: E731
    assert [strip(c.source) for c in new_code] == [strip(c.source) for c in book_code]


# --- the translation ------------------------------------------------------------------------------

CHAPTER = Path("book/03_scaling_and_temperature.ipynb")


def _chapter() -> colab_edition.Chapter:
    return colab_edition.Chapter(BOOK, CHAPTER, {"ex-03-demo": ("3.1", "A `demo` of {term}`softmax`")})


def translate(source: str) -> str:
    return colab_edition.translate_markdown(source, _chapter())


def test_terms_become_links_to_the_glossary_with_sphinx_anchors() -> None:
    site = colab_edition.site_url()
    out = translate("Each {term}`query` meets the {term}`KV cache <kv cache>` and `{term}` in code.")
    assert out == (f"Each [query]({site}book/glossary.html#term-query) meets the "
                   f"[KV cache]({site}book/glossary.html#term-KV-cache) and `{{term}}` in code.")
    from sphinx.util.nodes import _make_id  # the function Sphinx makes the glossary's ids with
    for term in BOOK.terms.values():
        assert colab_edition.sphinx_id(f"term-{term}") == _make_id(f"term-{term}")
    with pytest.raises(ValueError, match="not a term"):
        translate("{term}`no such term`")


def test_site_url_is_the_github_pages_address_of_the_repository() -> None:
    owner, repo, _ = colab_edition.repository()
    assert colab_edition.site_url() == f"https://{owner}.github.io/{repo}/"


def test_doc_ref_and_unknown_roles() -> None:
    site = colab_edition.site_url()
    assert translate("See {doc}`notation`.") == f"See [Notation]({site}book/notation.html)."
    assert translate("{ref}`the exercise <ex-03-entropy>`") == f"[the exercise]({site}book/03_scaling_and_temperature.html#ex-03-entropy)"
    assert translate("{ref}`ex-02-self-attention`") == f"[Exercise 2.1]({site}book/02_queries_keys_values.html#ex-02-self-attention)"
    with pytest.raises(ValueError, match="no Colab translation"):
        translate("{cite}`dao2022`")


def test_directives_comments_and_targets() -> None:
    source = "\n".join([
        "(sec-demo)=", "## A section", "% a comment for authors", "",
        ":::{exercise} A `demo` of {term}`softmax`", ":label: ex-03-demo", "", "Do it.", ":::", "",
        "::::{admonition} Going further: $T$ and `code`", ":class: dropdown", "",
        ":::{note}", "Inner note.", ":::", "", "```python", "x = '{term}`kept`'  # :::", "```", "::::",
    ])
    out = translate(source)
    assert "% a comment" not in out and "(sec-demo)=" not in out and ":class:" not in out and ":label:" not in out
    assert "### Exercise 3.1: A `demo` of [softmax](" in out
    assert "<details>\n<summary><b>Going further: <i>T</i> and <code>code</code></b></summary>\n\n" in out
    assert "**Note**\n\nInner note." in out
    assert "```python\nx = '{term}`kept`'  # :::\n```" in out, "code blocks are left as they are"
    assert check_edition.markdown_problems(out) == []
    with pytest.raises(ValueError, match="no Colab translation"):
        translate(":::{glossary}\nx\n  y\n:::")


def test_relative_images_and_links_become_absolute() -> None:
    owner, repo, branch = colab_edition.repository()
    out = translate("![Two boxes.](diagrams/ch03_demo.svg) and [chapter 2](02_queries_keys_values.ipynb#sec) "
                    "but not `![x](y.svg)`")
    raw = f"https://raw.githubusercontent.com/{owner}/{repo}/{branch}/book/diagrams/ch03_demo.svg?sanitize=true"
    assert out == (f"![Two boxes.]({raw}) and [chapter 2]({colab_edition.site_url()}book/02_queries_keys_values.html#sec) "
                   "but not `![x](y.svg)`")
    code_link = translate("[the loop](../attnlib/flash.py#L10)")
    assert code_link == f"[the loop](https://github.com/{owner}/{repo}/blob/{branch}/attnlib/flash.py#L10)"
    listing = "```python\ndef a():\n    pass\n\n\ndef b():  \n    pass\n```"
    assert translate(f"% comment\n\n\n\nText\n\n{listing}") == f"Text\n\n{listing}", "code blocks keep their blank lines"
    assert "<script" not in translate('<div id="x">fallback</div>\n<script type="module" src="../a.mjs"></script>\n')


def test_edition_of_a_chapter_folds_setup_and_solutions(tmp_path: Path) -> None:
    nb = nbformat.read(ROOT / CHAPTER, as_version=4)
    out = colab_edition.edition(CHAPTER, BOOK)
    first = out.cells[0]
    assert first.source.split("\n")[0] == colab_edition.SETUP_TITLE and first.metadata["cellView"] == "form"
    assert out.cells[1].source.startswith("# 3. ") and "Colab edition" in out.cells[1].source
    titles = [c.source.split("\n")[0] for c in out.cells if c.cell_type == "code" and c.metadata.get("cellView") == "form"]
    # the hide-cell code of section 3.2's two folds and of section 3.5's
    assert titles[1:] == ["# @title Going further (optional)"] * 3 + [
                          "# @title Solution to Exercise 3.1: Scaled weights with a temperature",
                          "# @title Solution to Exercise 3.2: Entropy from scratch",
                          "# @title Solution to Exercise 3.3: How cold for 99 %?"]
    assert len(out.cells) < len(nb.cells), "cells that held only a fence are left out"
    assert out.metadata["colab"] == {"toc_visible": True}


# --- the checker: each rule fails on a planted cell -----------------------------------------------

@pytest.mark.parametrize("planted, expected", [
    ("A raw {term}`softmax` role.", "raw MyST role {term}"),
    (":::{exercise} Title\nText\n:::", "':::'"),
    ("```{note}\nText\n```", "directive"),
    ("Text\n\n:class: dropdown", "option line"),
    ("(my-label)=\n# Title", "target"),
    ("% Solution: x, continued\nText", "'%' comment"),
    ("![A box.](diagrams/ch03_demo.svg)", "relative src"),
    ("[Notation](notation.md)", "relative href"),
    ('<script src="x.js"></script>', "<script>"),
    ("<details>\n\nText\n\n</details>", "without a <summary>"),
    ("<details>\n<summary>S</summary>\n\nText", "opened"),
])
def test_checker_fails_on_planted_markdown(planted: str, expected: str) -> None:
    problems = check_edition.markdown_problems(planted)
    assert any(expected in p for p in problems), problems


def test_checker_accepts_code_math_and_percent_in_prose() -> None:
    ok = "A `{term}` in code, 99 % of rows, $x_{i}$ and\n\n$$\n% a TeX comment\ny\n$$\n\n```\n:::{x}\n% y\n```"
    assert check_edition.markdown_problems(ok) == []


def _edition_and_book() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return colab_edition.edition(CHAPTER, BOOK), nbformat.read(ROOT / CHAPTER, as_version=4)


def test_checker_fails_on_an_unfolded_written_solution() -> None:
    edition, book = _edition_and_book()
    assert check_edition.notebook_problems(edition, book) == []
    cell = next(c for c in edition.cells if c.source.startswith("<details>\n<summary><b>Solution to"))
    cell.source = re.sub(r"</?details>|<summary>.*</summary>", "", cell.source).strip()  # unfolded
    assert any("written solution not folded" in p for p in check_edition.notebook_problems(edition, book))


def test_checker_fails_on_unfolded_solution_code_and_setup_cell() -> None:
    edition, book = _edition_and_book()
    code = next(c for c in edition.cells if c.source.startswith("# @title Solution"))
    del code.metadata["cellView"]
    edition.cells[0].source = edition.cells[0].source.split("\n", 1)[1]
    problems = check_edition.notebook_problems(edition, book)
    assert any("solution's code is not folded" in p for p in problems)
    assert any("cell 0: not the setup cell" in p for p in problems)


def test_checker_fails_on_a_missing_solution() -> None:
    edition, book = _edition_and_book()
    edition.cells = [c for c in edition.cells if "Solution to Exercise 3.3" not in c.source]
    assert any("is missing" in p for p in check_edition.notebook_problems(edition, book))


# --- the website's Colab button ---------------------------------------------------------------------

def _site_extension():
    spec = importlib.util.spec_from_file_location("attnbook_site", ROOT / "book" / "_ext" / "attnbook_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_colab_button_opens_the_edition() -> None:
    site = _site_extension()
    url = "https://colab.research.google.com/github/o/r/blob/main/book/03_scaling_and_temperature.ipynb"
    context = {"header_buttons": [{"label": "download-buttons", "buttons": [{"text": ".ipynb", "url": "x"}]},
                                  {"label": "launch-buttons", "buttons": [{"text": "Colab", "url": url}]}]}
    site.colab_edition_button(None, "book/03_scaling_and_temperature", "page.html", context, None)
    assert context["header_buttons"][1]["buttons"][0]["url"] == url.replace("/book/", "/colab/")
    assert context["header_buttons"][0]["buttons"][0]["url"] == "x"
    other = {"header_buttons": [{"label": "launch-buttons", "buttons": [{"text": "Colab", "url": url}]}]}
    site.colab_edition_button(None, "book/glossary", "page.html", other, None)  # no edition: unchanged
    assert other["header_buttons"][0]["buttons"][0]["url"] == url


def test_numref_text_takes_the_targets_number() -> None:
    site = colab_edition.site_url()
    assert translate("{numref}`Exercise %s <ex-03-entropy>`") == f"[Exercise 3.2]({site}book/03_scaling_and_temperature.html#ex-03-entropy)"


def test_heading_slug_links_reach_the_websites_section_ids() -> None:
    """``file.ipynb#slug`` (MyST's GitHub-style heading anchor) -> the id the website gives the section."""
    anchors = colab_edition.heading_anchors("# 9. Title\n\n## 9.8 PyTorch's `scaled_dot_product_attention` in practice\n\n"
                                            "```python\n# not a heading\n```\n\n## Summary\n\n### Summary\n\n## Summary\n", levels=2)
    assert anchors == {"9-title": "title", "98-pytorchs-scaled_dot_product_attention-in-practice":
                       "pytorch-s-scaled-dot-product-attention-in-practice", "summary": "summary", "summary-1": "summary"}
    chapter = colab_edition.Chapter(BOOK, Path("book/09_flash_attention_on_gpus.ipynb"), {})
    chapter.book = dataclasses.replace(BOOK, anchors={**BOOK.anchors, "book/09_flash_attention_on_gpus": anchors})
    page = f"{colab_edition.site_url()}book/09_flash_attention_on_gpus.html"
    out = colab_edition.translate_markdown(
        "[section 9.8](09_flash_attention_on_gpus.ipynb#98-pytorchs-scaled_dot_product_attention-in-practice) "
        "and [below](#summary)", chapter)
    assert out == f"[section 9.8]({page}#pytorch-s-scaled-dot-product-attention-in-practice) and [below]({page}#summary)"
