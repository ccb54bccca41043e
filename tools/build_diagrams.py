"""Write every registered diagram (attnbook.diagrams) to book/diagrams/NAME.svg; remove stale ones.

Run after changing a diagram's code: ``.venv/bin/python tools/build_diagrams.py``.
tests/test_diagrams.py fails while a stored file differs from what the code draws.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnbook.diagrams import registered  # noqa: E402

OUT = ROOT / "book" / "diagrams"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    drawn = registered()
    for name, d in sorted(drawn.items()):
        path = OUT / f"{name}.svg"
        text = d.svg()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print("wrote", path.relative_to(ROOT))
    for path in OUT.glob("*.svg"):
        if path.stem not in drawn:
            path.unlink()
            print("removed", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
