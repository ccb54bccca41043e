"""The notebooks' code is formatted by tools/format_notebooks.py (black, 88 columns) and fits 88 columns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import format_notebooks  # noqa: E402

CHAPTERS = format_notebooks.chapters()
#: Code lines longer than 88 characters a chapter may keep (long strings black cannot split), as a share.
MAX_WIDE = 0.05


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_cells_are_formatted(path: Path) -> None:
    changed = format_notebook_check(path)
    assert not changed, f"{path.name}: cells {changed} are not formatted: run tools/format_notebooks.py {path.relative_to(ROOT)}"


def format_notebook_check(path: Path) -> list[int]:
    return format_notebooks.format_notebook(path, check=True)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_fits_88_columns(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"][1:]  # the Colab install cell aside
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()]
    wide = [line for line in lines if len(line) > 88]
    assert len(wide) <= MAX_WIDE * len(lines), (
        f"{path.name}: {len(wide)} of {len(lines)} code lines are over 88 characters (at most {MAX_WIDE:.0%}); "
        f"split these strings: {[w.strip()[:60] for w in wide[:8]]}")


def test_the_formatter_moves_long_comments_and_keeps_form_titles() -> None:
    src = "x = compute_something(alpha, beta, gamma)  # " + "a long remark " * 5 + "\n# @title " + "T" * 90
    out = format_notebooks.format_source(src)
    assert out.splitlines()[0].startswith("# a long remark")
    assert "x = compute_something(alpha, beta, gamma)" in out.splitlines()
    assert out.splitlines()[-1] == "# @title " + "T" * 90
    assert format_notebooks.format_source(out) == out
    assert format_notebooks.format_source("y=f( 1,2 )") == "y = f(1, 2)"  # planted: black formats
