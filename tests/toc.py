"""The notebooks and pages listed in ``_toc.yml`` (run as a script: print the notebooks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _walk(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                yield node[key]
        for value in node.values():
            if isinstance(value, (list, dict)):
                yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def toc_files() -> list[Path]:
    """Every page of the book, in table-of-contents order, as a path relative to the repo root."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = []
    for entry in _walk(toc):
        matches = [p for p in (ROOT / f"{entry}.ipynb", ROOT / f"{entry}.md", ROOT / entry) if p.is_file()]
        if not matches:
            raise FileNotFoundError(f"_toc.yml lists {entry!r} but no such page exists")
        pages.append(matches[0].relative_to(ROOT))
    return pages


def toc_notebooks() -> list[Path]:
    return [p for p in toc_files() if p.suffix == ".ipynb"]


if __name__ == "__main__":
    print(" ".join(str(p) for p in toc_notebooks()))
