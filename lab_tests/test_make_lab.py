"""``make lab`` serves a working copy of the chapters, never the tracked notebooks in ``book/``.

JupyterLab autosaves every notebook it has open, so a server on ``book/`` would write a reader's
attempts (and every Run All's outputs) into the repository. The target is run here with
``JUPYTER_LAB`` set to a stand-in that prints what it would serve.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit import ROOT, make_lab


def _make_lab(folder: Path) -> list[str]:
    """Run ``make lab`` into ``folder`` (``setup`` taken as done); the arguments JupyterLab would get."""
    return make_lab(folder, folder.parent / "app-settings")


def test_make_lab_renders_every_cell(tmp_path: Path) -> None:
    # JupyterLab's default windowing renders only the cells in view, so the glossary cell at the
    # end is missing while the {term} links above it render (one console error per link).
    _make_lab(tmp_path / "my-book")
    overrides = json.loads((tmp_path / "app-settings" / "overrides.json").read_text(encoding="utf-8"))
    assert overrides["@jupyterlab/notebook-extension:tracker"]["windowingMode"] == "none"


def test_make_lab_serves_a_working_copy_and_keeps_the_readers_edits(tmp_path: Path) -> None:
    folder = tmp_path / "my-book"
    served = _make_lab(folder)
    assert served[-1] == str(folder), f"make lab serves {served[-1]!r}, not the working copy {folder}"
    assert Path(served[-1]).resolve() != (ROOT / "book").resolve()
    chapters = sorted(p.name for p in (ROOT / "book").glob("*.ipynb"))
    assert chapters and sorted(p.name for p in folder.glob("*.ipynb")) == chapters
    assert (folder / "diagrams").is_dir(), "the copy lacks the diagrams the chapters show"
    # A reader's edit survives the next `make lab`; a chapter they deleted comes back.
    edited, deleted = folder / chapters[0], folder / chapters[1]
    edited.write_text(edited.read_text(encoding="utf-8").replace('"cells": [', '"cells": [ ', 1), encoding="utf-8")
    mine = edited.read_text(encoding="utf-8")
    deleted.unlink()
    _make_lab(folder)
    assert edited.read_text(encoding="utf-8") == mine, "make lab overwrote the reader's copy of a chapter"
    assert deleted.read_text(encoding="utf-8") == (ROOT / "book" / chapters[1]).read_text(encoding="utf-8")
