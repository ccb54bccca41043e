"""The notebook comparison of ``make test`` (``tests/nbval_numbers.py``): it accepts what another CPU
changes (one unit in the last printed decimal digit, ``1.`` for ``1.0000``) and nothing more."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbval_numbers import same_to_last_digit

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("tensor([1.0000, 1.0000, 1.0000])", "tensor([1., 1., 1.])"),
        ("row sums: tensor([1., 1.])", "row sums: tensor([1.0000, 1.0000])"),
        ("error 0.0036, KL 1.13e-05", "error 0.0037, KL 1.14e-05"),
        ("largest entry elsewhere: 0.7", "largest entry elsewhere: 0.6"),
        ("-0.0000", "0.0000"),
        ("<td>0.3214</td>", "<td>0.3213</td>"),
        ("1.5e-3", "0.0015"),
    ],
)
def test_one_unit_in_the_last_digit_reads_the_same(stored: str, fresh: str) -> None:
    assert same_to_last_digit(stored, fresh)


@pytest.mark.parametrize(
    "stored, fresh",
    [
        ("error 0.0036", "error 0.0038"),           # two units in the last digit
        ("error 0.0036", "error 0.0046"),           # one unit past the last digit
        ("KL 1.13e-05", "KL 2.80e-05"),
        ("KL 1.13e-05", "KL 1.13e-06"),             # the exponent moved
        ("72 MiB", "73 MiB"),                       # integers are exact
        ("32,896 positions", "32,897 positions"),
        ("0.31", "0.3214"),                         # more digits, a different value
        ("a 0.3214 b", "a  0.3214 b"),              # text between numbers is exact
        ("0.3214 True", "0.3214 False"),
        ("ch08", "ch09"),                           # digits inside a word are text
        ("tensor([0.5, 1.])", "tensor([0.5, 1., 1.])"),
    ],
)
def test_anything_else_differs(stored: str, fresh: str) -> None:
    assert not same_to_last_digit(stored, fresh)


def _cell(source: str, stored: str, *, html: bool = False) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    if html:
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": stored, "text/plain": "<IPython.core.display.HTML object>"})]
    else:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored)]
    return cell


def _run_nbval(tmp_path: Path, cells: list[nbformat.NotebookNode], plugin: bool = True) -> dict[int, str]:
    """Run nbval (with or without the plugin) on a notebook of planted cells: ``{cell index: PASSED/FAILED}``."""
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "planted.ipynb"
    nbformat.write(nb, path)
    args = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-rA", "-q", "-p", "no:cacheprovider",
            "-c", os.devnull, "--rootdir", str(tmp_path), str(path)]
    if plugin:
        args[3:3] = ["-p", "nbval_numbers"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    results = {int(m[2]): m[1] for m in re.finditer(r"^(PASSED|FAILED) planted\.ipynb::Cell (\d+)", run.stdout, re.M)}
    assert len(results) == len(cells), run.stdout + run.stderr
    return results


def test_nbval_accepts_another_cpus_digits_and_fails_on_a_changed_number(tmp_path: Path) -> None:
    cells = [
        _cell('print("tensor([1., 1., 1.])")', "tensor([1.0000, 1.0000, 1.0000])\n"),   # 0: format only
        _cell('print("attention error 0.0037")', "attention error 0.0036\n"),           # 1: one unit
        _cell('print("attention error 0.0037")', "attention error 0.0035\n"),           # 2: two units
        _cell('print("attention error 0.0046")', "attention error 0.0036\n"),           # 3: one unit past the last digit
        _cell('print("blocks: 12")', "blocks: 11\n"),                                   # 4: an integer
        _cell("from IPython.display import HTML, display\ndisplay(HTML('<td>0.3213</td>'))",
              "<td>0.3214</td>", html=True),                                             # 5: HTML, one unit
        _cell("from IPython.display import HTML, display\ndisplay(HTML('<td>0.3213</td>'))",
              "<td>0.3215</td>", html=True),                                             # 6: HTML, two units
    ]
    assert _run_nbval(tmp_path, cells) == {
        0: "PASSED", 1: "PASSED", 2: "FAILED", 3: "FAILED", 4: "FAILED", 5: "PASSED", 6: "FAILED",
    }


def test_without_the_plugin_nbval_refuses_a_format_change(tmp_path: Path) -> None:
    """Why the plugin exists: strict nbval fails on ``1.`` for ``1.0000``, the same number."""
    cells = [_cell('print("tensor([1., 1., 1.])")', "tensor([1.0000, 1.0000, 1.0000])\n")]
    assert _run_nbval(tmp_path, cells, plugin=False) == {0: "FAILED"}
