"""Exercises are numbered per chapter on the website ("Exercise 3.1", "Exercise 3.2", ...), as in
JupyterLab and the Colab edition, and every solution's title names its exercise's number."""

from __future__ import annotations

import re

import pytest
from sitekit import NOTEBOOK_PAGES, SITE, TocPage


@pytest.mark.parametrize("page", NOTEBOOK_PAGES, ids=str)
def test_exercises_numbered_per_chapter(page: TocPage) -> None:
    html = (SITE / page.url_path).read_text(encoding="utf-8")
    chapter = int(page.source.name[:2])
    found = re.findall(r'"> Exercise ([\d.]+) \(', html)
    numbers = list(dict.fromkeys(found))
    assert numbers, f"{page}: no numbered exercise found"
    assert numbers == [f"{chapter}.{k}" for k in range(1, len(numbers) + 1)], f"{page}: exercises numbered {numbers}"
    solutions = re.findall(r"Solution to<a [^>]*> Exercise ([\d.]+)", html)
    assert solutions and set(solutions) <= set(numbers), f"{page}: solution titles {solutions} vs exercises {numbers}"
