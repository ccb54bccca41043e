"""Re-execute book notebooks top to bottom and store their outputs (what nbval later compares).

Usage: .venv/bin/python tools/execute_notebook.py book/03_scaling_and_temperature.ipynb [...]

Runs each notebook in a fresh kernel with ``book/`` as the working directory (as JupyterLab and
nbval do), then drops the ipywidgets state that the executor would store: the website shows
the kernel-free version of each slider instead of dead widgets.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) chunks into one output, as a reader sees them.

    How a kernel splits its output into chunks depends on timing; merged, the stored notebook
    is the same on every run and the page shows one block per cell.
    """
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" and prev.name == out.name:
            prev.text += out.text
        else:
            merged.append(out)
    return merged


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=1200,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,  # nbclient needs it for Output widgets; dropped below
    )
    start = time.perf_counter()
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    nb.metadata.pop("widgets", None)
    # ipykernel's own kernelspec, which JupyterLab writes when its kernel starts (a notebook that
    # stored another would be marked modified on opening; tools/sync_notebooks.py checks it too).
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nbformat.write(nb, path)
    print(f"executed {path} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        execute(Path(arg))
