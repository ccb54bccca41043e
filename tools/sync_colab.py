"""Write the Colab install cell into every chapter notebook, from the one place it is set.

The repository URL and branch are set in ``_config.yml`` (``repository.url`` and
``repository.branch``) and nowhere else by hand: this script copies them into the first cell of
each notebook in ``_toc.yml`` and into ``pyproject.toml``'s Homepage.
``tests/test_colab.py`` fails when they disagree.

Usage: .venv/bin/python tools/sync_colab.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from toc import toc_notebooks  # noqa: E402

MARKER = "# Colab only:"
#: Notebooks whose chapter needs the pretrained-model extra.
NEEDS_PRETRAINED = {"07_pretrained_model"}


def repository() -> tuple[str, str]:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = config["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def colab_cell_source(url: str, branch: str, extras: str = "") -> str:
    return "\n".join(
        [
            f"{MARKER} fetch the book and install attnlib with what Colab lacks. Elsewhere this cell does nothing.",
            "import sys",
            'if "google.colab" in sys.modules:',
            f"    !git clone --quiet --depth 1 --branch {branch} {url} /content/inside-self-attention",
            f"    %pip install --quiet /content/inside-self-attention{extras}",
            "    %cd /content/inside-self-attention/book",
        ]
    )


def expected_source(notebook: Path) -> str:
    url, branch = repository()
    extras = "[pretrained]" if notebook.stem in NEEDS_PRETRAINED else ""
    return colab_cell_source(url, branch, extras)


def sync_notebook(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    source = expected_source(path)
    first = nb.cells[0] if nb.cells else None
    if first is not None and first.cell_type == "code" and first.source.startswith(MARKER):
        if first.source == source:
            return False
        first.source = source
    else:
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell"]})
        cell.execution_count = None
        nb.cells.insert(0, cell)
    nb.cells[0].metadata["tags"] = ["remove-cell"]
    nbformat.write(nb, path)
    return True


def sync_pyproject() -> bool:
    url, _ = repository()
    path = ROOT / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    new = re.sub(r'^Homepage = ".*"$', f'Homepage = "{url}"', text, flags=re.M)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    changed = [str(p) for p in toc_notebooks() if sync_notebook(ROOT / p)]
    if sync_pyproject():
        changed.append("pyproject.toml")
    print("updated: " + (", ".join(changed) if changed else "nothing"))
