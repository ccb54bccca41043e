"""Every chapter numbers its sections N.M and every "chapter N" / "section N.M" in the text is a link.

tools/link_references.py makes it so; the website's build (``-W -n``) fails on a link to a
section that does not exist.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import link_references as lr  # noqa: E402


def test_sections_numbered_and_references_linked() -> None:
    chap = lr.chapters()
    nbs = {n: nbformat.read(p, as_version=4) for n, p in chap.items()}
    problems = [p for n, nb in nbs.items() for p in lr.number_sections(nb, n)]
    secs = {n: lr.sections(nb) for n, nb in nbs.items()}
    for n, nb in nbs.items():
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                new, bad = lr.link_text(cell.source, n, chap, secs)
                problems += [f"{chap[n].name}: {b}" for b in bad]
                if new != cell.source:
                    problems.append(f"{chap[n].name}: plain reference in {cell.source[:60]!r}...")
    for md in sorted((ROOT / "book").glob("*.md")):
        new, bad = lr.link_text(md.read_text(encoding="utf-8"), None, chap, secs)
        problems += [f"{md.name}: {b}" for b in bad] + ([f"{md.name}: plain reference"] if new != md.read_text(encoding="utf-8") else [])
    assert not problems, "run tools/link_references.py:\n" + "\n".join(problems[:30])


def test_the_linker_links_and_leaves_code_alone() -> None:
    chap = {7: Path("07_x.ipynb"), 9: Path("09_y.ipynb")}
    secs = {9: {"9.3": "93-one-kernel"}}
    text = "As chapter 7 shows (`chapter 7`), see section 9.3 and chapters 7 and 9; $chapter 7$."
    new, bad = lr.link_text(text, 9, chap, secs)
    assert new == ("As [chapter 7](07_x.ipynb) shows (`chapter 7`), see [section 9.3](#93-one-kernel) and "
                   "chapters [7](07_x.ipynb) and 9; $chapter 7$.")
    assert not bad
    assert lr.link_text("section 9.9", 9, chap, secs)[1] == ["section 9.9 does not exist"]  # planted
    assert lr.slugify("9.3 One fused kernel in `Triton`: $O(S)$ memory") == "93-one-fused-kernel-in-triton--memory"
