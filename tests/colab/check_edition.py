"""Check what Colab shows of the Colab edition (``colab/``, written by ``tools/colab_edition.py``).

Usage: .venv/bin/python tests/colab/check_edition.py [book/NN_slug.ipynb | colab/NN_slug.ipynb ...]

Run by ``make test-colab`` before any chapter runs, and by ``tests/test_colab_edition.py`` in
``make test``. Each markdown cell of the edition is rendered as Colab renders it (CommonMark with
HTML, GitHub's tables and strikethrough, ``$`` and ``$$`` math), and a chapter FAILS when:

* the rendered text shows MyST: a role (``{term}`` followed by code), a ``:::`` fence, a
  ```` ```{name} ```` block, a directive option line (``:class:``), a target (``(label)=``) or a
  MyST comment (a line starting with ``%``);
* a solution is unfolded: a cell that is part of a solution in the book (by cell id) is not one
  ``<details>`` block with a ``<summary>``, or a solution's code cell is not in Colab's form view
  with a ``# @title``, or a solution's text is missing from the edition;
* a ``<details>`` has no ``<summary>`` or is not closed in its cell;
* an image or link has a relative address (Colab resolves none), or a ``<script>`` is left;
* the first cell is not the setup cell, folded (form view, ``# @title``);
* the edition is out of step with the chapters (run ``tools/colab_edition.py``).
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Any

import nbformat
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import colab_edition  # noqa: E402
import sync_colab  # noqa: E402
import sync_notebooks  # noqa: E402
from toc import toc_notebooks  # noqa: E402

_MD = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).use(dollarmath_plugin, double_inline=True)

RAW_ROLE = re.compile(r"\{[A-Za-z][\w:-]*\}`")
#: Source lines (outside code and math) that only MyST reads.
MYST_LINES = [
    (re.compile(r"^[ \t]*:{3,}"), "a ':::' fence"),
    (re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*\{"), "a '```{...}' directive"),
    (re.compile(r"^[ \t]*:[\w-]+:(\s|$)"), "a directive option line"),
    (re.compile(r"^[ \t]*\([^()\s]+\)=[ \t]*$"), "a MyST target '(label)='"),
    (re.compile(r"^[ \t]*%"), "a MyST '%' comment line"),
]


def render(source: str) -> str:
    """The HTML Colab would make of a markdown cell (math left as marked spans)."""
    return _MD.render(source)


def visible_text(rendered: str) -> str:
    """The text a reader sees: code shown as `CODE`, math as $MATH$, tags dropped."""
    text = re.sub(r"<pre>[\s\S]*?</pre>", "\n", rendered)
    text = re.sub(r"<code>[\s\S]*?</code>", "`CODE`", text)
    text = re.sub(r'<(span|div|section) class="math[^"]*"[^>]*>[\s\S]*?</\1>', "$MATH$", text)
    text = re.sub(r"<[^>]+>", "", text)
    return html.unescape(text)


def _prose_lines(source: str) -> list[str]:
    """Lines of a markdown cell outside fenced code and ``$$`` math."""
    lines, fence, math = [], None, False
    for line in source.split("\n"):
        stripped = line.strip()
        if fence is not None:
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                fence = None
            continue
        if math:
            math = not stripped.endswith("$$")
            continue
        code = re.match(r"^[ \t]*(`{3,}|~{3,})(?!.*\{)", line)
        if code:
            fence = code.group(1)
            continue
        if stripped.startswith("$$"):
            math = stripped == "$$" or not stripped[2:].endswith("$$")
            continue
        lines.append(line)
    return lines


def markdown_problems(source: str) -> list[str]:
    """What is wrong with one markdown cell of the edition, as Colab would show it."""
    problems = []
    rendered = render(source)
    text = visible_text(rendered)
    for match in RAW_ROLE.finditer(text):
        problems.append(f"raw MyST role {match.group()[:-1]} in the text")
    if ":::" in text:
        problems.append("raw ':::' in the text")
    if re.search(r'class="language-\{', rendered):
        problems.append("a '```{...}' directive shown as a code block")
    for line in _prose_lines(source):
        for pattern, what in MYST_LINES:
            if pattern.match(line):
                problems.append(f"{what}: {line.strip()[:60]!r}")
    if re.search(r"<script\b", rendered, re.I):
        problems.append("a <script> element (Colab runs none in markdown)")
    for attr, url in re.findall(r'<(?:img|a)\b[^>]*?\b(src|href)="([^"]*)"', rendered):
        if not re.match(r"^(https?:|mailto:|#)", url):
            problems.append(f"a relative {attr} {url!r}, which does not resolve in Colab")
    opened, closed = len(re.findall(r"<details\b", rendered)), len(re.findall(r"</details>", rendered))
    summaries = len(re.findall(r"<details\b[^>]*>\s*<summary\b", rendered))
    if opened != closed:
        problems.append(f"{opened} <details> opened, {closed} closed")
    if summaries != opened:
        problems.append("a <details> without a <summary> first")
    return problems


def folded(source: str) -> bool:
    """True when the whole cell is one ``<details>`` block that starts with its summary."""
    text = source.strip()
    if not (text.startswith("<details>") and text.endswith("</details>")):
        return False
    inner = text[len("<details>"):-len("</details>")]
    return "<details" not in inner and "</details>" not in inner and inner.lstrip().startswith("<summary>")


def notebook_problems(edition: Any, book: Any) -> list[str]:
    """What is wrong with one chapter of the edition (``book``: the chapter notebook it came from)."""
    problems = []
    first = edition.cells[0] if edition.cells else None
    if (first is None or first.cell_type != "code" or not first.source.startswith("# @title ")
            or first.metadata.get("cellView") != "form" or sync_colab.MARKER not in first.source):
        problems.append("cell 0: not the setup cell folded in form view (cellView 'form' and a '# @title' line)")
    cells = {cell.get("id"): (index, cell) for index, cell in enumerate(edition.cells)}
    for index, cell in enumerate(edition.cells):
        if cell.cell_type == "markdown":
            problems += [f"cell {index}: {p}" for p in markdown_problems(cell.source)]
    for role, cell in zip(sync_notebooks.solution_roles(book), book.cells):
        if role is None or role == "end-fence":
            continue
        found = cells.get(cell.get("id"))
        if cell.cell_type == "code":
            if found is None:
                problems.append(f"a solution code cell ({cell.get('id')}) is missing")
                continue
            index, new = found
            if new.metadata.get("cellView") != "form" or not new.source.startswith("# @title "):
                problems.append(f"cell {index}: a solution's code is not folded (form view and '# @title')")
            continue
        if found is None:
            has_text = re.sub(r"^[ \t]*(%.*|:{3,}.*|:[\w-]+:.*)$", "", cell.source, flags=re.M).strip()
            if has_text:
                problems.append(f"the written solution of book cell {cell.get('id')} is missing")
            continue
        index, new = found
        if not folded(new.source):
            problems.append(f"cell {index}: a written solution not folded in <details>")
    return problems


def edition_problems(notebooks: list[Path] | None = None) -> dict[Path, list[str]]:
    """{chapter: its problems} for the chapters named (book/ or colab/ paths), default every one."""
    chapters = [Path("book") / Path(p).name for p in notebooks] if notebooks else toc_notebooks()
    files = colab_edition.build(chapters)
    out = {}
    for chapter in chapters:
        path = colab_edition.edition_path(chapter)
        problems = []
        if not (ROOT / path).is_file():
            out[chapter] = [f"{path} is missing: run tools/colab_edition.py"]
            continue
        if (ROOT / path).read_text(encoding="utf-8") != files[path]:
            problems.append(f"{path} is out of step with {chapter}: run tools/colab_edition.py")
        problems += notebook_problems(nbformat.read(ROOT / path, as_version=4), nbformat.read(ROOT / chapter, as_version=4))
        out[chapter] = problems
    return out


def main(argv: list[str]) -> int:
    results = edition_problems([Path(a) for a in argv] or None)
    for chapter, problems in results.items():
        path = colab_edition.edition_path(chapter)
        print(f"{'FAIL' if problems else 'ok':4} {path}  markdown as Colab renders it, folded solutions, setup cell")
        for problem in problems:
            print(f"       FAIL {problem}")
    failed = sum(1 for p in results.values() if p)
    print(f"colab edition: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
