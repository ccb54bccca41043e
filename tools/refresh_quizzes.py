"""Store each chapter's quiz output as its cell would display it now, without re-running the chapter.

Usage: .venv/bin/python tools/refresh_quizzes.py [--check]

A chapter's quiz cell is ``show_quiz("NN_slug")``; what it displays depends only on the quiz's JSON
file and ``attnbook/quiz.py`` (:func:`attnbook.quiz.quiz_html`, deterministic), not on anything
the chapter computed before it. After editing a quiz, this writes that HTML into the stored output,
exactly what re-executing the notebook would store there. ``tests/test_quizzes.py`` fails while a
stored quiz differs from its JSON.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnbook.quiz import load_quiz, quiz_html  # noqa: E402

CALL = re.compile(r"""show_quiz\(\s*["']([^"']+)["']\s*\)""")


def stale_quizzes(path: Path, *, write: bool) -> list[str]:
    """The quiz names whose stored output in ``path`` differs from what they display now."""
    nb = nbformat.read(path, as_version=4)
    stale = []
    for cell in nb.cells:
        match = CALL.search(cell.source) if cell.cell_type == "code" else None
        if not match:
            continue
        html = quiz_html(match.group(1), load_quiz(match.group(1)))
        outputs = [o for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
        if len(outputs) != 1:
            raise ValueError(f"{path.name}: the quiz cell should have one HTML output, has {len(outputs)}")
        if outputs[0]["data"]["text/html"] != html:
            stale.append(match.group(1))
            outputs[0]["data"]["text/html"] = html
    if stale and write:
        nbformat.write(nb, path)
    return stale


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = {p.name: s for p in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
             if (s := stale_quizzes(p, write=not check))}
    for name, quizzes in stale.items():
        print(f"{name}: {'stale' if check else 'refreshed'} quiz output {quizzes}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
