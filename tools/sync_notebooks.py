"""Give every chapter notebook the cell metadata that JupyterLab, Colab and the website read.

Usage: .venv/bin/python tools/sync_notebooks.py [--check] [book/NN_slug.ipynb ...]

With no notebook named, every notebook of ``_toc.yml`` is synced. It prints what it changed;
running it again changes nothing (it is idempotent), so it can be re-run after any branch that
edits the notebooks has been merged. ``--check`` changes nothing and exits 1 when a notebook
would change (``tests/test_book_structure.py`` checks the same). Only markdown cells are split
and metadata (and a solution's ``# @title`` line) written, so stored outputs stay valid and no
notebook needs re-executing.

The rules:

1. **Solutions start folded.** An exercise's solution is the cells from ``:::{solution-start}``
   to ``:::{solution-end}`` (sphinx-exercise's gated syntax, which the website turns into one
   dropdown). A markdown cell that holds other text besides a fence (the exercise before a
   ``solution-start``, or the next exercise after a ``solution-end``) is split in two at the
   fence, so that every cell is either part of a solution or not. Then:

   * the ``solution-start`` cell stays as it is: jupyterlab-myst draws it as a folded dropdown
     ("Solution to Exercise N"), with the text it holds inside;
   * every cell after it, up to and including the ``solution-end`` cell, gets
     ``"jupyter": {"source_hidden": true}`` (code cells also ``"outputs_hidden": true``), which
     JupyterLab reads when it opens a notebook and draws as a folded cell that opens on a click
     (the ``solution-end`` cell too, unless it holds nothing but the fence: that one stays
     visible, an empty box that closes the solution). A folded cell shows its first line, so a
     folded markdown cell starts with the MyST comment ``% Solution: <the exercise's title>,
     continued`` (not rendered, on the website or in JupyterLab) instead of the solution's first words;
   * the written part of a solution (every markdown cell's text, less its fences and its
     ``% Solution`` comment) is wrapped in a closed dropdown, "Show the solution" (:data:`FOLD`),
     and a ``solution-end`` fence in an HTML ``<div>`` (:data:`GATE_OPEN`, :data:`GATE_CLOSE`).
     JupyterLab's Run All renders every markdown cell it runs and unfolds it (it sets
     ``inputHidden = false``), so ``source_hidden`` alone left every written solution open after
     Run All, and each ``solution-end`` an empty box; a fold in the cell's own text survives a
     re-render. (The ``solution-start`` fence still renders then, as jupyterlab-myst's closed
     "Start of Solution to Exercise N" dropdown, with nothing inside.) The website, which folds the
     whole solution in one dropdown, drops both wrappers (``book/_ext/attnbook_site.py``), and so
     does the Colab edition, which folds each written part its own way
     (``tools/colab_edition.py``); :func:`unfold_written_solution` removes them;
   * every code cell of a solution gets Colab's form view, ``"cellView": "form"``, and a first
     line ``# @title Solution: <the exercise's title>``: Colab shows the title and hides the code
     until "Show code" is clicked. (The website leaves the ``# @title`` line out, see
     ``book/_ext/attnbook_site.py``.)

2. **A cell that only feeds a static slider shows its figure, not its plumbing.** A code cell
   that calls ``static_slider(`` and defines no function or class (its settings, title and alt
   text) is tagged ``hide-input``: the website folds its code behind "Show code cell source".

2b. **An optional code cell is folded everywhere.** A code cell tagged ``hide-cell`` whose first
   line is ``# Going further (optional): <what it shows>`` (:data:`OPTIONAL`), the code of a folded
   "Going further" block, gets ``jupyter.source_hidden`` and ``outputs_hidden`` (with ``collapsed:
   true``): JupyterLab shows that first line folded, as the website shows the cell behind "Show code
   cell content". (The Colab edition gives it Colab's form view.)

3. **Code shown from the library stays equal to it.** A markdown cell may show lines of a source
   file as a fenced Python block, marked by an HTML comment on the line just above the fence::

       <!-- code from ../attnlib/flash.py, from "START TEXT" to "END TEXT" -->
       ```python
       ...
       ```

   The path is relative to the notebook. The block is rewritten with the file's lines from the
   first line that contains ``START TEXT`` through the first line at or after it that contains
   ``END TEXT`` (the ``:start-at:`` and ``:end-at:`` of Sphinx's ``literalinclude``), exactly as
   they are, indentation included. Unlike a ``literalinclude`` directive, which Colab shows as
   raw text and jupyterlab-myst does not resolve, a fenced block shows the code everywhere; the
   comment is invisible on the website (MyST passes it through as an HTML comment), in JupyterLab
   and in Colab. A marker whose file, start or end text is not found is an error, so a change to the
   library that moves or renames the lines stops the sync instead of leaving stale code.

4. **JupyterLab shows the chapter, not the website's scaffolding.**

   * The Colab install cell (the first cell, ``# Colab only: ...``) is folded
     (``jupyter.source_hidden``): JupyterLab shows its first line above the title, not its code.
   * Every cell of a solution is folded, its ``solution-start`` and ``solution-end`` cells too,
     each with a first line that names it (``% Solution: <title>`` and ``% Solution: <title>, end``,
     MyST comments that the website does not render): jupyterlab-myst renders each cell alone, so it
     draws an unjoined gate as a box titled "Start of Solution to Exercise N" and an empty box.
   * A notebook opens unmodified: a cell whose output is folded also carries the old
     ``collapsed: true`` (JupyterLab writes it on opening otherwise), and the kernelspec is the
     one ``ipykernel`` installs (``Python 3 (ipykernel)``, which JupyterLab writes when its kernel
     starts). Either difference marked every notebook modified two seconds after it was opened.
   * A live slider's cell stores only the note ``attnbook.slider.LIVE_NOTE`` in place of the
     widget (its state is not stored, so the widget cannot be drawn before the cell runs and
     JupyterLab would show its text form, ``interactive(children=(FloatLogSlider(...``). This is
     the one rule that touches outputs; those cells are ``nbval-ignore-output`` and
     ``remove-output`` (nbval and the website ignore them).
   * ``{term}`` roles resolve in JupyterLab: the last cell holds this chapter's terms of
     ``glossary.md`` as a MyST glossary (as a definition list, jupyterlab-myst's syntax) inside a
     dropdown "Glossary: the terms of this chapter", so a term's link shows its definition. The cell
     is tagged ``remove-cell``: the website links the terms to its own glossary page.

5. **Exercises carry their chapter's number everywhere.** Every ``{exercise}`` (and
   ``{exercise-start}``) directive gets the option ``:enumerator: N.k`` (chapter N, its k-th exercise,
   in order; the chapter is the notebook's file-name prefix). jupyterlab-myst numbers exercises per
   notebook ("Exercise 1") unless a directive sets its own number, so JupyterLab now shows "Exercise
   3.1" and "Solution to Exercise 3.1", as the website (Sphinx numbers them per chapter and ignores the
   option, ``book/_ext/attnbook_site.py``) and the Colab edition do.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from toc import toc_notebooks  # noqa: E402

START = re.compile(r"^(:{3,})\{solution-start\}", re.M)
END = re.compile(r"^(:{3,})\{solution-end\}", re.M)
EXERCISE = re.compile(r"^:{3,}\{exercise(?:-start)?\}[ \t]*(.*)$", re.M)
TITLE = "# @title "
#: The first line of an optional code cell (tagged ``hide-cell``): the code of a folded "Going further" block.
OPTIONAL = "# Going further (optional): "
COMMENT = "% Solution: "
#: The fold around a written solution's text: a MyST dropdown that jupyterlab-myst draws closed,
#: whatever re-renders the cell, with the text inside rendered as everywhere else (maths, roles).
#: (A raw ``<details>`` block folds too, but jupyterlab-myst renders the markdown inside it as plain
#: HTML: no maths, and ``{term}`` roles shown as "{undefined}".) Its fence is longer than any in the text.
FOLD_TITLE = "Show the solution"
FOLD = re.compile(r"^(?P<fence>:{4,})\{admonition\} " + re.escape(FOLD_TITLE) + r"\n:class: dropdown\n\n(?P<text>.*?)\n(?P=fence)$",
                  re.M | re.S)
#: Around a ``solution-end`` fence: jupyterlab-myst draws that fence alone as an empty box, and
#: inside an HTML block as nothing. The website drops these two lines.
GATE_OPEN, GATE_CLOSE = '<div class="attnbook-gate">', "</div><!-- attnbook-gate -->"
GATE = re.compile(r"^" + re.escape(GATE_OPEN) + r"\n\n(?P<text>.*?)\n\n" + re.escape(GATE_CLOSE) + r"$", re.M | re.S)
CODE_FROM = re.compile(r'^<!-- code from (?P<path>\S+), from "(?P<start>[^"]+)" to "(?P<end>[^"]+)" -->[ \t]*\n'
                       r'(?P<fence>```python[ \t]*\n)(?P<body>.*?)^```[ \t]*$', re.M | re.S)


def _fence_end(text: str, start: int, colons: int) -> int:
    """The index just after the line that closes the fence opened at ``start`` (``colons`` colons)."""
    pos = text.index("\n", start) + 1 if "\n" in text[start:] else len(text)
    for line in re.finditer(r"^.*$", text[pos:], re.M):
        stripped = line.group().strip()
        if stripped and set(stripped) == {":"} and len(stripped) >= colons:
            return pos + line.end()
    raise ValueError(f"the fence at {text[start:start + 40]!r} is never closed")


def _has_text(text: str) -> bool:
    """True when ``text`` holds more than blank lines and this tool's own ``% Solution`` comment."""
    return any(line.strip() and not line.startswith(COMMENT) for line in text.split("\n"))


def split_points(text: str) -> list[int]:
    """Where a markdown cell must be split so that no cell holds both solution and other text."""
    points = []
    for match in START.finditer(text):
        if _has_text(text[:match.start()]):
            points.append(match.start())
    for match in END.finditer(text):
        after = _fence_end(text, match.start(), len(match.group(1)))
        rest = text[after:].strip()
        if rest and rest != GATE_CLOSE:  # the line that closes the fence's own <div> stays with it
            points.append(after)
    return sorted(set(points))


def _split_markdown(nb: Any) -> bool:
    changed = False
    cells = []
    for cell in nb.cells:
        points = split_points(cell.source) if cell.cell_type == "markdown" else []
        if not points:
            cells.append(cell)
            continue
        changed = True
        bounds = [0, *points, len(cell.source)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            part = cell.source[a:b].strip("\n")
            if not part.strip():
                continue
            new = nbformat.v4.new_markdown_cell(part, metadata=dict(cell.metadata))
            # Deterministic ids: the first part keeps the cell's id, the others derive from it.
            new.id = cell.id if k == 0 else f"{cell.id[:58]}-s{k}"
            cells.append(new)
    nb.cells = cells
    return changed


def solution_roles(nb: Any) -> list[str | None]:
    """Each cell's part in an exercise solution: ``start``, ``body``, ``end`` (with text), ``end-fence`` or None."""
    roles: list[str | None] = []
    inside = False
    for cell in nb.cells:
        is_md = cell.cell_type == "markdown"
        if is_md and START.search(cell.source) and not inside:
            inside = not END.search(cell.source)
            roles.append("start")
        elif inside and is_md and END.search(cell.source):
            inside = False
            text = "\n".join(line for line in unfold_written_solution(cell.source).split("\n") if not line.startswith(COMMENT))
            only_fence = not END.sub("", text).replace(":", "").strip()
            roles.append("end-fence" if only_fence else "end")
        else:
            roles.append("body" if inside else None)
    if inside:
        raise ValueError("a solution-start has no solution-end")
    return roles


def unfold_written_solution(text: str) -> str:
    """``text`` (a solution's markdown) without the folds that :func:`fold_written_solution` adds."""
    return GATE.sub(lambda m: m["text"], FOLD.sub(lambda m: m["text"], text))


def fold_written_solution(text: str) -> str:
    """``text`` (a solution's markdown, without its ``% Solution`` comment) with the part that is
    not a fence folded in one closed dropdown, "Show the solution", and a ``solution-end`` fence
    inside :data:`GATE_OPEN` and :data:`GATE_CLOSE`."""
    text = unfold_written_solution(text)
    start, end = START.search(text), END.search(text)
    head_end = _fence_end(text, start.start(), len(start.group(1))) if start else 0
    tail_start = end.start() if end and end.start() >= head_end else len(text)
    head, body, tail = text[:head_end].strip("\n"), text[head_end:tail_start].strip("\n"), text[tail_start:].strip("\n")
    if body.strip():
        fence = ":" * max([4, *(len(m.group()) + 1 for m in re.finditer(r"^:{3,}", body, re.M))])
        body = f"{fence}{{admonition}} {FOLD_TITLE}\n:class: dropdown\n\n{body}\n{fence}"
    if tail:
        tail = f"{GATE_OPEN}\n\n{tail}\n\n{GATE_CLOSE}"
    return "\n\n".join(part for part in (head, body, tail) if part)


def exercise_titles(nb: Any) -> list[str | None]:
    """For each cell, the title of the last exercise above it (None before the first)."""
    titles, title = [], None
    for cell in nb.cells:
        titles.append(title)
        if cell.cell_type == "markdown":
            for match in EXERCISE.finditer(cell.source):
                title = match.group(1).strip() or "exercise"
    return titles


def only_feeds_a_static_slider(source: str) -> bool:
    """A code cell that calls ``static_slider`` and defines no function or class."""
    if "static_slider(" not in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: never a slider cell
        return False
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == "static_slider"]
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree))
    return bool(calls) and not defines


def source_lines(path: Path, start: str, end: str) -> str:
    """The lines of ``path`` from the first containing ``start`` through the next containing ``end``."""
    lines = path.read_text().splitlines()
    try:
        first = next(i for i, line in enumerate(lines) if start in line)
        last = next(i for i in range(first, len(lines)) if end in lines[i])
    except StopIteration:
        raise ValueError(f"{path}: no line containing {start!r} followed by one containing {end!r}") from None
    return "\n".join(lines[first:last + 1])


def sync_code_from(source: str, folder: Path) -> str:
    """``source`` (a markdown cell) with every marked fenced block replaced by the lines it names."""
    def fill(match: re.Match[str]) -> str:
        code = source_lines((folder / match["path"]).resolve(), match["start"], match["end"])
        head = match.group()[:match.start("body") - match.start()]
        return f"{head}{code}\n```"
    return CODE_FROM.sub(fill, source)


def _set(mapping: Any, key: str, value: Any) -> bool:
    if mapping.get(key) == value:
        return False
    mapping[key] = value
    return True


def _drop(mapping: Any, key: str) -> bool:
    return mapping.pop(key, None) is not None


#: The kernelspec that ``ipykernel`` installs, which JupyterLab writes into a notebook when its
#: kernel starts: stored as is, opening a notebook changes nothing.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
COLAB_MARKER = "# Colab only:"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
GLOSSARY_ID = "jupyterlab-glossary"
GLOSSARY_TITLE = "Glossary: the terms of this chapter"
TERM = re.compile(r"\{term\}`([^`]*)`")


def _live_note() -> str:
    sys.path.insert(0, str(ROOT))
    from attnbook.slider import LIVE_NOTE

    return LIVE_NOTE


def live_slider_outputs(outputs: list[Any]) -> list[Any]:
    """A live-slider cell's stored outputs with the widget (and its key-handling script) replaced
    by one note: the widget's state is not stored, so no notebook can draw it before the cell runs."""
    if not any(WIDGET_VIEW in out.get("data", {}) for out in outputs):
        return outputs
    kept = []
    for out in outputs:
        data = out.get("data", {})
        if WIDGET_VIEW in data or "attnlibLiveKeys" in data.get("text/html", ""):
            continue
        kept.append(out)
    note = nbformat.v4.new_output("display_data", data={"text/plain": _live_note()})
    return [*kept, note]


def glossary_entries(path: Path = ROOT / "book" / "glossary.md") -> dict[str, tuple[str, list[str]]]:
    """``{term (lower case): (the term as written, its definition's lines)}`` of the glossary in ``path``.

    A term listed on several lines before one definition (synonyms) gets that definition each."""
    text = path.read_text(encoding="utf-8")
    block = text.split(":::{glossary}", 1)[1].split("\n:::", 1)[0]
    entries: dict[str, tuple[str, list[str]]] = {}
    names: list[str] = []
    for line in block.split("\n"):
        if line.startswith(":") and not line.startswith(": "):
            continue  # the directive's options (:sorted:)
        if line.strip() and not line[0].isspace():
            if names and entries[names[-1].lower()][1]:
                names = []  # a new entry
            names.append(line.strip())
            entries[line.strip().lower()] = (line.strip(), [])
        elif names:
            for name in names:
                entries[name.lower()][1].append(line)
    return {k: v for k, v in entries.items() if "".join(v[1]).strip()}


def terms_used(text: str) -> list[str]:
    """The glossary terms (lower case) that ``{term}`` roles in ``text`` point at."""
    found = []
    for match in TERM.finditer(text):
        role = match.group(1)
        target = re.match(r".*<([^<>]+)>\s*$", role, re.S)
        found.append(" ".join((target.group(1) if target else role).split()).lower())
    return found


def glossary_cell_source(terms: list[str], entries: dict[str, tuple[str, list[str]]]) -> str:
    """A dropdown holding a MyST glossary of ``terms`` (and every term their definitions use)."""
    wanted, queue = set(), [t for t in terms if t in entries]
    while queue:
        term = queue.pop()
        if term not in wanted:
            wanted.add(term)
            queue += [t for t in terms_used("\n".join(entries[term][1])) if t in entries]
    parts = []
    for term in sorted(wanted):
        name, definition = entries[term]
        lines = [line[2:] if line.startswith("  ") else line.strip() for line in definition]
        while lines and not lines[-1].strip():
            lines.pop()
        body = "\n".join(["  " + line if line.strip() else "" for line in lines]).strip("\n")
        # {doc} roles point at the website's pages, which a notebook does not have: plain text.
        body = re.sub(r"\{doc\}`([^`]*)`", r"\1", body)
        parts.append(f"{name}\n: {body.lstrip()}")
    return (f"::::{{admonition}} {GLOSSARY_TITLE}\n:class: dropdown\n\n:::{{glossary}}\n"
            + "\n\n".join(parts) + "\n:::\n::::")


def _sync_glossary(nb: Any, entries: dict[str, tuple[str, list[str]]]) -> bool:
    last = nb.cells[-1] if nb.cells else None
    has_cell = last is not None and last.get("id") == GLOSSARY_ID
    cells = nb.cells[:-1] if has_cell else nb.cells
    terms = [t for c in cells if c.cell_type == "markdown" for t in terms_used(c.source)]
    if not terms:
        if has_cell:
            nb.cells.pop()
        return has_cell
    source = glossary_cell_source(terms, entries)
    metadata = {"tags": ["remove-cell"]}
    if has_cell and last.cell_type == "markdown" and last.source == source and dict(last.metadata) == metadata:
        return False
    cell = nbformat.v4.new_markdown_cell(source, metadata=metadata)
    cell.id = GLOSSARY_ID
    if has_cell:
        nb.cells[-1] = cell
    else:
        nb.cells.append(cell)
    return True


EXERCISE_HEAD = re.compile(r"^(?P<head>:{3,}\{exercise(?:-start)?\}.*\n(?:[ \t]*:(?!enumerator:)[\w-]+:.*\n)*)"
                           r"(?:[ \t]*:enumerator:.*\n)?", re.M)


def number_exercises(nb: Any, chapter: str) -> bool:
    """Rule 5: give the k-th exercise of chapter ``chapter`` the option ``:enumerator: chapter.k``."""
    changed, k = False, 0
    for cell in nb.cells:
        if cell.cell_type != "markdown" or "{exercise" not in cell.source:
            continue

        def number(match: re.Match[str]) -> str:
            nonlocal k
            k += 1
            return f"{match.group('head')}:enumerator: {chapter}.{k}\n"

        new = EXERCISE_HEAD.sub(number, cell.source if cell.source.endswith("\n") else cell.source + "\n")
        new = new if cell.source.endswith("\n") else new[:-1]
        if new != cell.source:
            cell.source = new
            changed = True
    return changed


def sync(nb: Any, folder: Path = ROOT / "book", chapter: str | None = None) -> bool:
    """Apply the rules to ``nb`` (a notebook in ``folder``, chapter number ``chapter``) in place;
    True when anything changed."""
    changed = _split_markdown(nb)
    if chapter is not None:
        changed |= number_exercises(nb, chapter)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "<!-- code from " in cell.source:
            new = sync_code_from(cell.source, folder)
            changed |= new != cell.source
            cell.source = new
    glossary = folder / "glossary.md"
    if glossary.is_file():
        changed |= _sync_glossary(nb, glossary_entries(glossary))
    if nb.metadata.get("kernelspec") != KERNELSPEC:
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
        changed = True
    roles, titles = solution_roles(nb), exercise_titles(nb)
    for index, (cell, role, title) in enumerate(zip(nb.cells, roles, titles)):
        meta = cell.metadata
        jupyter = dict(meta.get("jupyter", {}))
        colab = index == 0 and cell.cell_type == "code" and cell.source.startswith(COLAB_MARKER)
        optional = cell.cell_type == "code" and "hide-cell" in meta.get("tags", []) and cell.source.startswith(OPTIONAL)
        hidden = role is not None or colab or optional
        if hidden:
            jupyter["source_hidden"] = True
            if cell.cell_type == "code" and not colab:
                jupyter["outputs_hidden"] = True
        else:
            jupyter.pop("source_hidden", None)
            jupyter.pop("outputs_hidden", None)
        if jupyter:
            changed |= _set(meta, "jupyter", jupyter)
        else:
            changed |= _drop(meta, "jupyter")
        # JupyterLab writes the old form of a folded output, collapsed: true, when it opens a notebook.
        if jupyter.get("outputs_hidden"):
            changed |= _set(meta, "collapsed", True)
        else:
            changed |= _drop(meta, "collapsed")
        lines = cell.source.split("\n")
        if cell.cell_type == "markdown":
            # A folded cell shows its first line; for prose, a MyST comment (invisible when rendered)
            # names what it holds instead of giving the solution's first words away.
            has_comment = lines[0].startswith(COMMENT)
            if hidden:
                name = title or "exercise"
                comment = {"start": f"{COMMENT}{name}", "end-fence": f"{COMMENT}{name}, end"}.get(
                    role, f"{COMMENT}{name}, continued")
                text = fold_written_solution("\n".join(lines[1:] if has_comment else lines))
                source = f"{comment}\n{text}" if text else comment
                if cell.source != source:
                    cell.source = source
                    changed = True
            elif has_comment or FOLD.search(cell.source) or GATE.search(cell.source):
                cell.source = unfold_written_solution("\n".join(lines[1:] if has_comment else lines))
                changed = True
        if cell.cell_type != "code":
            continue
        live = "live_slider(" in cell.source or "nbval-ignore-output" in cell.metadata.get("tags", [])
        if live and cell.outputs:  # any live widget (ipywidgets.interact too) whose output nbval ignores
            outputs = live_slider_outputs(cell.outputs)
            if outputs is not cell.outputs:
                cell.outputs = outputs
                changed = True
        has_title = lines[0].startswith(TITLE)
        if role == "body":
            heading = f"{TITLE}Solution: {title or 'exercise'}"
            if lines[0] != heading and not lines[0].startswith("%%"):  # a cell magic must stay first
                cell.source = "\n".join([heading, *(lines[1:] if has_title else lines)])
                changed = True
            changed |= _set(meta, "cellView", "form")
        else:
            if has_title and meta.get("cellView") == "form":
                cell.source = "\n".join(lines[1:])
                changed = True
            changed |= _drop(meta, "cellView")
        # Only ever added: an author may fold other cells' code too.
        tags = list(meta.get("tags", []))
        if only_feeds_a_static_slider(cell.source) and "hide-input" not in tags:
            meta["tags"] = [*tags, "hide-input"]
            changed = True
    return changed


def sync_file(path: Path, *, write: bool = True) -> bool:
    nb = nbformat.read(path, as_version=4)
    prefix = re.match(r"(\d+)_", path.name)
    changed = sync(nb, path.resolve().parent, str(int(prefix.group(1))) if prefix else None)
    if changed and write:
        nbformat.validate(nb)
        nbformat.write(nb, path)
    return changed


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"] or [ROOT / p for p in toc_notebooks()]
    changed = [str(p.resolve().relative_to(ROOT) if p.resolve().is_relative_to(ROOT) else p)
               for p in paths if sync_file(p, write=not check)]
    if check:
        print("would change: " + (", ".join(changed) if changed else "nothing"))
        return 1 if changed else 0
    print("updated: " + (", ".join(changed) if changed else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
