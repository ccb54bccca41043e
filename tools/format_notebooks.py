"""Format the code cells of the chapter notebooks with black (88 columns), the book's one code style.

Usage: .venv/bin/python tools/format_notebooks.py [--check] [book/NN_slug.ipynb ...]

With no notebook named, every chapter notebook of ``book/`` is formatted. Only the source of code
cells changes (outputs, metadata and markdown stay as they are), so stored outputs stay valid and
no notebook needs re-executing. ``--check`` changes nothing and exits 1 when a cell would change;
``tests/test_code_format.py`` runs the same check. The Colab install cell is
``tools/sync_colab.py``'s and is left as it writes it. Quotes are left as written
(``string_normalization=False``). black does not split comments or strings: keep those under 88
characters by hand (the test also counts the lines that are still longer).
"""

from __future__ import annotations

import argparse
import io
import sys
import textwrap
import tokenize
from pathlib import Path

import black
import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sync_colab import MARKER  # noqa: E402  (the Colab install cell, which sync_colab.py writes)

ROOT = Path(__file__).resolve().parents[1]
MODE = black.Mode(line_length=88, string_normalization=False, is_ipynb=True)


WIDTH = MODE.line_length


def _comments(src: str) -> dict[int, int]:
    """{line number (0-based): column} of every comment that follows code on its line."""
    out = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT and tok.line[: tok.start[1]].strip():
                out[tok.start[0] - 1] = tok.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return {}
    return out


def place_comments(src: str) -> str:
    """Move a trailing comment that makes its line too long onto its own line above the code, and
    wrap a comment line that is too long (black leaves both as they are, or splits the code around them).

    A Colab form line (``# @title ...``) is never touched.
    """
    lines = src.split("\n")
    trailing = _comments(src)
    out: list[str] = []
    for n, line in enumerate(lines):
        if n in trailing:
            code, comment = line[: trailing[n]].rstrip(), line[trailing[n]:]
            if len(code) + 2 + len(comment) > WIDTH:
                indent = line[: len(line) - len(line.lstrip())]
                out += _wrap(indent, comment)
                out.append(code)
                continue
            line = f"{code}  {comment}"  # one style: two spaces before a trailing comment
        stripped = line.lstrip()
        if stripped.startswith("#") and not stripped.startswith("# @") and len(line) > WIDTH:
            out += _wrap(line[: len(line) - len(stripped)], stripped)
            continue
        out.append(line)
    return "\n".join(out)


def _wrap(indent: str, comment: str) -> list[str]:
    body = comment.lstrip("#").strip()
    return textwrap.wrap(body, WIDTH - len(indent) - 2, initial_indent=indent + "# ",
                         subsequent_indent=indent + "# ", break_long_words=False, break_on_hyphens=False)


def format_source(src: str) -> str:
    """``src`` with its long comments placed (:func:`place_comments`), then as black writes it."""
    placed = place_comments(src)
    try:
        return black.format_cell(placed, fast=False, mode=MODE)
    except black.NothingChanged:
        return placed


def format_notebook(path: Path, *, check: bool) -> list[int]:
    """Format ``path`` in place (unless ``check``); the indices of the cells that change."""
    nb = nbformat.read(path, as_version=4)
    changed = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip() or cell.source.startswith(MARKER):
            continue
        new = format_source(cell.source)
        if new != cell.source:
            changed.append(i)
            cell.source = new
    if changed and not check:
        nbformat.write(nb, path)
    return changed


def chapters() -> list[Path]:
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("notebooks", nargs="*", type=Path)
    args = ap.parse_args()
    bad = 0
    for path in args.notebooks or chapters():
        changed = format_notebook(path, check=args.check)
        if changed:
            bad += 1
            print(f"{path}: {'would reformat' if args.check else 'reformatted'} cells {changed}")
    return 1 if (bad and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
