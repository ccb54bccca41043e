"""The reader's install (book/how_to_use.md, requirements-reader.txt) stays real and small.

* how_to_use.md clones the repository that ``_config.yml`` names, installs PyTorch and the reader's
  requirements at the versions of ``requirements.txt`` (which produced the stored outputs), and links
  the repository's issues for reports.
* ``requirements-reader.txt`` pins exactly what the chapters need (attnlib and the extras every
  chapter imports) plus JupyterLab and jupyterlab-myst, at ``requirements.txt``'s versions, and none
  of the development toolchain.
"""

from __future__ import annotations

import re
import sys

import tomllib
from toc import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import sync_colab  # noqa: E402

URL, _BRANCH = sync_colab.repository()
HOW_TO = (ROOT / "book" / "how_to_use.md").read_text(encoding="utf-8")
READER = ROOT / "requirements-reader.txt"
#: The extras of pyproject.toml that the chapters import (attnbook; transformers and the MiniLM
#: weights in chapters 7-10; einops in chapter 6).
EXTRAS = ("book", "pretrained", "einops")
#: Besides attnlib's requirements, a reader needs only these.
READER_TOOLS = {"jupyterlab", "jupyterlab-myst"}


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and ";" not in line:
            name, version = line.split("==", 1)
            pins[sync_colab._name(name)] = version.strip()
    return pins


BOOK_PINS = _pins((ROOT / "requirements.txt").read_text(encoding="utf-8"))


def _project_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    return {sync_colab._name(r) for r in wanted}


def test_reader_requirements_are_the_books_versions_and_nothing_more() -> None:
    text = READER.read_text(encoding="utf-8")
    assert f"-e .[{','.join(EXTRAS)}]" in [line.strip() for line in text.splitlines()], "requirements-reader.txt does not install attnlib with the chapters' extras"
    pins = _pins(text)
    expected = _project_requirements() | READER_TOOLS
    assert set(pins) == expected, (f"requirements-reader.txt pins {sorted(set(pins) - expected)} it should not, "
                                   f"and misses {sorted(expected - set(pins))}")
    stale = {name: (v, BOOK_PINS.get(name)) for name, v in pins.items() if BOOK_PINS.get(name) != v}
    assert not stale, f"requirements-reader.txt differs from requirements.txt (reader, book): {stale}"


def test_how_to_clones_the_configured_repository_and_installs_the_reader_requirements() -> None:
    assert "<the repository>" not in HOW_TO
    name = URL.rstrip("/").rsplit("/", 1)[1]
    assert re.search(rf"^git clone {re.escape(URL)}(\.git)?\s*$", HOW_TO, re.M), f"how_to_use.md does not clone {URL}"
    assert re.search(rf"^cd {re.escape(name)}\s*$", HOW_TO, re.M), f"how_to_use.md does not cd into {name}"
    assert re.search(r"^pip install -r requirements-reader\.txt\b", HOW_TO, re.M)
    torch = re.search(r"^pip install torch==(\S+) --index-url https://download\.pytorch\.org/whl/cpu\s*$", HOW_TO, re.M)
    assert torch and torch.group(1) == BOOK_PINS["torch"], f"how_to_use.md's CPU PyTorch is not requirements.txt's torch {BOOK_PINS['torch']}"
    assert f"@ git+{URL}" in HOW_TO, "how_to_use.md's install for a downloaded notebook names another repository"


def test_how_to_links_the_issues_for_reports() -> None:
    assert f"]({URL}/issues)" in HOW_TO, f"how_to_use.md has no link to {URL}/issues"
