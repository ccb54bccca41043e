"""Number every chapter's sections the same way and make every "chapter N" / "section N.M" a link.

Usage: .venv/bin/python tools/link_references.py [--check]

1. **Sections numbered alike.** In chapter N, every ``##`` heading except the closing ones
   (Summary, References, Quiz, Exercises) reads ``## N.M Title``, M counting from 1. A chapter
   whose sections are not numbered yet gets the numbers; one that is numbered is left as it is
   (renumbering would silently change what "section N.M" elsewhere points at: the check says so).
2. **References as links.** In the markdown of the chapters and the book's pages, a plain
   "chapter 7" becomes ``[chapter 7](07_pretrained_model.ipynb)`` and "section 9.6" becomes
   ``[section 9.6](09_flash_attention_on_gpus.ipynb#96-flexattention-...)`` (``#96-...`` alone
   inside chapter 9): plain Markdown links, which the website, JupyterLab and GitHub all follow
   (the website also checks every anchor: Sphinx warns on a missing one and the build fails).
   Text inside code, math, headings, existing links and MyST roles is left alone.

``--check`` changes nothing and exits 1 when something would change, printing what;
``tests/test_references.py`` checks the same.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CLOSING = ("Summary", "References", "Quiz", "Exercises")

# Spans a reference inside of which is left alone: fenced code, inline code, display and inline
# math, MyST roles, existing links (and images), HTML tags, headings.
PROTECTED = re.compile(
    r"```.*?```|~~~.*?~~~|\$\$.*?\$\$|\$[^$\n]+\$|\{[a-z-]+\}`[^`]*`|`[^`\n]*`|!?\[[^\]]*\]\([^)]*\)"
    r"|<[^>\n]+>|^#{1,6} .*?$|^:::.*?$|^%.*?$",
    re.S | re.M,
)
# "section 3.2.1" (a paper's section) and "section 3 of ..." are not the book's: a number followed by
# ".digit" is left alone, and so is anything after "et al." or "paper" in the same sentence (below).
REFERENCE = re.compile(r"\b([Cc]hapters?|[Ss]ections?) (\d+(?:\.\d+)?)((?:(?:, | and | or | to |-)\d+(?:\.\d+)?)*)(?!\.?\d)")


def slugify(title: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``): its text and inline code, math left out,
    lower case, spaces to hyphens, punctuation dropped (``myst_parser``'s ``default_slugify``)."""
    text = re.sub(r"\$[^$]*\$", "", title).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", text.lower().replace(" ", "-"))


def chapters() -> dict[int, Path]:
    return {int(p.name[:2]): p for p in sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))}


def sections(nb: nbformat.NotebookNode) -> dict[str, str]:
    """{"N.M": anchor} of a notebook's numbered ``##`` headings."""
    out = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for m in re.finditer(r"^## (\d+\.\d+) (.*)$", cell.source, re.M):
                out[m.group(1)] = slugify(f"{m.group(1)} {m.group(2)}")
    return out


def number_sections(nb: nbformat.NotebookNode, n: int) -> list[str]:
    """Number an unnumbered chapter's ``##`` sections in place; what changed (or why not)."""
    heads = [(cell, m) for cell in nb.cells if cell.cell_type == "markdown"
             for m in re.finditer(r"^## (?!(?:%s)\b)(.*)$" % "|".join(CLOSING), cell.source, re.M)]
    numbered = [bool(re.match(rf"{n}\.\d+ ", m.group(1))) for _, m in heads]
    if all(numbered):
        expected = [f"{n}.{i}" for i in range(1, len(heads) + 1)]
        found = [m.group(1).split(" ", 1)[0] for _, m in heads]
        return [] if found == expected else [f"chapter {n}: sections numbered {found}, expected {expected} (fix by hand)"]
    if any(numbered):
        return [f"chapter {n}: some sections numbered, some not (fix by hand)"]
    changes = []
    for i, (cell, m) in enumerate(heads, 1):
        old = m.group(0)
        new = f"## {n}.{i} {m.group(1)}"
        cell.source = cell.source.replace(old, new, 1)
        changes.append(f"chapter {n}: {old!r} -> {new!r}")
    return changes


def link_text(text: str, here: int | None, chap: dict[int, Path], secs: dict[int, dict[str, str]]) -> tuple[str, list[str]]:
    """``text`` with its plain references linked (``here``: the chapter it is in, or None)."""
    problems: list[str] = []

    def target(num: str) -> str | None:
        if "." in num:
            c = int(num.split(".")[0])
            anchor = secs.get(c, {}).get(num)
            if anchor is None:
                problems.append(f"section {num} does not exist")
                return None
            return f"#{anchor}" if c == here else f"{chap[c].name}#{anchor}"
        c = int(num)
        if c not in chap:
            problems.append(f"chapter {num} does not exist")
            return None
        return None if c == here else chap[c].name

    def link_one(m: re.Match[str]) -> str:
        word, first, rest = m.group(1), m.group(2), m.group(3)
        nums = [first] + re.findall(r"\d+(?:\.\d+)?", rest)
        seps = re.split(r"\d+(?:\.\d+)?", rest)[:-1] if rest else []
        is_section = word.lower().startswith("section")
        if is_section != ("." in first):
            return m.group(0)  # "chapter 3.2" or "section 4": not a reference this tool knows
        if "-" in seps:
            return m.group(0)  # a range ("chapters 8-11"): left as text
        out, links = [], [target(x) for x in nums]
        if len(nums) == 1:
            return f"[{word} {first}]({links[0]})" if links[0] else m.group(0)
        out.append(word + " ")
        for i, (x, t) in enumerate(zip(nums, links)):
            out.append(f"[{x}]({t})" if t else x)
            if i < len(seps):
                out.append(seps[i])
        return "".join(out)

    pieces, pos = [], 0
    for p in PROTECTED.finditer(text):
        pieces.append(REFERENCE.sub(link_one, text[pos:p.start()]))
        pieces.append(p.group(0))
        pos = p.end()
    pieces.append(REFERENCE.sub(link_one, text[pos:]))
    return "".join(pieces), problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    chap = chapters()
    nbs = {n: nbformat.read(p, as_version=4) for n, p in chap.items()}
    report: list[str] = []
    for n, nb in nbs.items():
        report += number_sections(nb, n)
    secs = {n: sections(nb) for n, nb in nbs.items()}
    changed: set[Path] = set()
    for n, nb in nbs.items():
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            new, problems = link_text(cell.source, n, chap, secs)
            report += [f"{chap[n].name}: {p}" for p in problems]
            if new != cell.source:
                cell.source = new
                changed.add(chap[n])
    pages = {}
    for md in sorted(BOOK.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        new, problems = link_text(text, None, chap, secs)
        report += [f"{md.name}: {p}" for p in problems]
        if new != text:
            pages[md] = new
    numbered = {chap[n] for n in nbs if any(r.startswith(f"chapter {n}: '") for r in report)}
    for path in sorted(changed | numbered | set(pages)):
        report.append(f"{path.name}: {'would change' if args.check else 'changed'}")
    if not args.check:
        for n, nb in nbs.items():
            if chap[n] in changed | numbered:
                nbformat.write(nb, chap[n])
        for md, text in pages.items():
            md.write_text(text, encoding="utf-8")
    print("\n".join(report))
    return 1 if args.check and report else 0


if __name__ == "__main__":
    sys.exit(main())
