"""Shared pytest configuration: nbval must run exactly the notebooks that ``_toc.yml`` lists."""

from __future__ import annotations

from pathlib import Path

import pytest
from toc import ROOT, toc_notebooks


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("nbval", default=False):
        return
    collected = {Path(str(item.fspath)).resolve() for item in items if str(item.fspath).endswith(".ipynb")}
    expected = {(ROOT / p).resolve() for p in toc_notebooks()}
    missing = sorted(str(p.relative_to(ROOT)) for p in expected - collected)
    if missing:
        raise pytest.UsageError(f"nbval did not collect these notebooks from _toc.yml: {missing}")
