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
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from toc import toc_notebooks  # noqa: E402

MARKER = "# Colab only:"
#: Notebooks whose chapter needs the pretrained-model extra.
NEEDS_PRETRAINED = {"07_pretrained_model"}
#: Where the cell clones the repository in Colab.
CLONE_DIR = "/content/inside-self-attention"
#: Requirements of attnlib (pyproject.toml) that Colab already provides. The cell installs attnlib
#: with --no-deps and then only the other requirements, pinned to the versions in requirements.txt
#: that produced the book's outputs, so it never replaces a package Colab ships (upgrading Colab's
#: ipywidgets 7 to 8, as a plain `pip install` would, breaks its widget display).
COLAB_PROVIDES = {"torch", "numpy", "matplotlib", "ipython", "ipywidgets", "transformers"}
#: The cell prints nothing when all goes well, as outside Colab. `!pip` rather than `%pip`, which always
#: adds "Note: you may need to restart the kernel"; `-qq` hides pip's warnings too (Colab runs pip as
#: root outside a virtual environment, and its pip is older than PyPI's: both print a warning with a
#: single -q), while errors still show. `%cd -q` does not print the new directory.
PIP_QUIET = "-qq"
#: transformers 4.x (Colab's until 2026-01) imports Colab's TensorFlow whenever it is installed, and
#: TensorFlow prints a dozen log lines to stderr on import; USE_TF=0, set before anything imports
#: transformers, stops the import. transformers 5 never imports TensorFlow.
SILENCE_TF = "# transformers 4.x: do not import Colab's TensorFlow (and its log lines)"


def repository() -> tuple[str, str]:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = config["repository"]
    return repo["url"].rstrip("/"), str(repo.get("branch", "main"))


def _name(requirement: str) -> str:
    """The normalised project name of a requirement string: 'JupyterQuiz>=2.9' -> 'jupyterquiz'."""
    name = re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_packages(extras: tuple[str, ...] = ()) -> list[str]:
    """The pinned packages the cell installs besides attnlib and attnbook: their requirements Colab lacks."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            pins[_name(name)] = f"{name.strip()}=={version.strip()}"
    packages = []
    for requirement in wanted:
        name = _name(requirement)
        if name in COLAB_PROVIDES:
            continue
        if name not in pins:
            raise ValueError(f"{requirement!r} (pyproject.toml) has no exact pin in requirements.txt")
        packages.append(pins[name])
    return packages


def colab_cell_source(url: str, branch: str, extras: tuple[str, ...] = ()) -> str:
    install = " ".join(colab_packages(extras))
    lines = [
        f"{MARKER} fetch the book and install attnlib with what Colab lacks. Elsewhere this cell does nothing.",
        "import sys",
        'if "google.colab" in sys.modules:',
        "    import os",
        f'    os.environ["USE_TF"] = "0"  {SILENCE_TF}',
        f"    !test -d {CLONE_DIR} || git clone --quiet --depth 1 --branch {branch} {url} {CLONE_DIR}",
        f"    !pip install {PIP_QUIET} --no-deps {CLONE_DIR}",
    ]
    if install:
        lines.append(f"    !pip install {PIP_QUIET} {install}")
    lines.append(f"    %cd -q {CLONE_DIR}/book")
    return "\n".join(lines)


def expected_source(notebook: Path) -> str:
    url, branch = repository()
    extras = ("book", "pretrained") if notebook.stem in NEEDS_PRETRAINED else ("book",)
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
