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


def _slider_html(values: list[float]) -> str:
    """A kernel-free slider of two frames, the second one showing ``values``."""
    from attnbook.slider import Frame, Panel, static_slider

    def frame(t: int) -> Frame:
        row = [0.25, 0.5, 0.75] if t == 0 else values
        return Frame(label=f"t = {t}", panels=[Panel([row], ["q"], ["a", "b", "c"], "w", vmin=0.0, vmax=1.0)])

    html = static_slider(frame, [{"t": 0}, {"t": 1}], slider_label="t", title="demo", alt="demo").data
    return re.sub(r"attnlib-slider-[0-9a-f]+", "ID", html)


def test_a_sliders_frames_are_compared_by_the_numbers_they_print() -> None:
    """The frames travel gzip-compressed; they read the same when each printed number does."""
    stored = _slider_html([0.1, 0.5049, 0.9])
    # another CPU's last bits: the same printed numbers, so the same colours and bytes
    assert _slider_html([0.1, 0.5000001, 0.9]) == stored
    # one unit in the last printed digit, and the colour that number takes: reads the same
    assert same_to_last_digit(stored, _slider_html([0.1, 0.5051, 0.9]))
    # two units, or another number entirely: differs
    assert not same_to_last_digit(stored, _slider_html([0.1, 0.5251, 0.9]))
    assert not same_to_last_digit(stored, _slider_html([0.1, 0.5, 0.8]))


def test_a_sliders_colour_may_change_only_with_its_number() -> None:
    stored = _slider_html([0.1, 0.5, 0.9])
    # the same printed numbers with one colour index changed in the packed frames: differs
    packed = re.search(r'class="attnlib-data">([^<]*)<', stored).group(1)
    import base64
    import gzip
    import json

    data = json.loads(gzip.decompress(base64.b64decode(packed)))
    data["f"][1]["p"][0]["i"][1] += 1
    forged = base64.b64encode(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)).decode()
    assert not same_to_last_digit(stored, stored.replace(packed, forged))
    # and in the visible first frame: the same number in another colour differs
    first = re.search(r'<td style="background:(#[0-9a-f]{6})', stored).group(1)
    assert not same_to_last_digit(stored, stored.replace(first, "#000000", 1))
