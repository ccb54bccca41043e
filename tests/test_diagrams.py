"""The book's explanatory diagrams: drawn from code, stored in step, legible on a phone, placed in the text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnbook.diagrams import MIN_TEXT_PX, PHONE_WIDTH, Diagram, registered

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
IMAGE = re.compile(r"!\[([^\]]*)\]\(diagrams/([a-z0-9_]+)\.svg\)")

DRAWN = registered()


def _markdown_images() -> list[tuple[str, str, str]]:
    out = []
    for nb in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for alt, name in IMAGE.findall("".join(cell["source"])):
                    out.append((nb.name, alt, name))
    for md in sorted(BOOK.glob("*.md")):
        for alt, name in IMAGE.findall(md.read_text()):
            out.append((md.name, alt, name))
    return out


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_stored_diagram_matches_its_code(name: str) -> None:
    path = BOOK / "diagrams" / f"{name}.svg"
    assert path.exists(), f"{path} missing: run tools/build_diagrams.py"
    assert path.read_text() == DRAWN[name].svg(), f"{path} differs from its code: run tools/build_diagrams.py"


def test_no_stale_diagram_files() -> None:
    stale = sorted(p.name for p in (BOOK / "diagrams").glob("*.svg") if p.stem not in DRAWN)
    assert not stale, f"diagram files no code draws: {stale}"


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_diagram_is_placed_in_a_chapter_with_its_alt_text(name: str) -> None:
    uses = [(where, alt) for where, alt, n in _markdown_images() if n == name]
    assert uses, f"diagram {name} is drawn but no markdown cell shows it"
    chapter = name[2:4]
    for where, alt in uses:
        assert alt == DRAWN[name].alt, f"{where}: alt text of {name} differs from the diagram's"
    assert any(where.startswith(chapter) for where, _ in uses), f"{name} is not shown in chapter {chapter}"


def test_every_markdown_diagram_exists() -> None:
    missing = sorted({(w, n) for w, _, n in _markdown_images() if n not in DRAWN})
    assert not missing, f"markdown shows diagrams that no code draws: {missing}"


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_text_legible_at_phone_width(name: str) -> None:
    svg = (BOOK / "diagrams" / f"{name}.svg").read_text()
    width = float(re.search(r'<svg[^>]* width="([\d.]+)"', svg).group(1))
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes, f"{name} has no text"
    shown = min(sizes) * min(1.0, PHONE_WIDTH / width)
    assert shown >= MIN_TEXT_PX - 1e-9, f"{name}: smallest text shows at {shown:.1f} px on a phone"


def test_the_checks_can_fail() -> None:
    tiny = Diagram("ch99_tiny", 700, 100, title="t", alt="a")
    tiny.text(10, 50, "small", size=12)
    with pytest.raises(ValueError, match="on a phone"):
        tiny.svg()
    with pytest.raises(ValueError, match="palette"):
        Diagram("ch99_red", 100, 100, title="t", alt="a").rect(0, 0, 5, 5, fill="#FF0000")
    with pytest.raises(ValueError, match="alt text"):
        Diagram("ch99_noalt", 100, 100, title="t", alt=" ")
