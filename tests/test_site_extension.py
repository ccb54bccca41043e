"""The book's Sphinx extension (``book/_ext/attnbook_site.py``): code highlighting without plain spans."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

from pygments.token import Keyword, Name, Punctuation, String
from sphinx.highlighting import PygmentsBridge

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "book" / "_ext"))
import attnbook_site  # noqa: E402

STYLES = list(attnbook_site.DEFAULT_PYGMENTS_STYLES.values())
CODE = 'import torch\nx = torch.ones(2, 3)  # [B, S]\nprint(f"{x.sum():.1f}", x.shape)\n'


def highlighted(drop: bool, options: dict | None = None) -> str:
    bridge = PygmentsBridge("html", "tango")
    app = SimpleNamespace(builder=SimpleNamespace(highlighter=bridge, theme_options=options or {}))
    if drop:
        attnbook_site.drop_plain_spans(app)
    return bridge.highlight_block(CODE, "python")


def test_plain_token_types_are_drawn_like_text_in_both_styles() -> None:
    plain = attnbook_site.plain_token_types(STYLES)
    assert {Name, Punctuation} <= plain
    assert not {Keyword, Keyword.Namespace, String, Name.Builtin} & plain


def test_dropping_plain_spans_keeps_the_text_and_the_coloured_tokens() -> None:
    full, lean = highlighted(False), highlighted(True)
    assert re.sub("<[^>]+>", "", full) == re.sub("<[^>]+>", "", lean)
    assert '<span class="n">' in full and '<span class="n">' not in lean and '<span class="p">' not in lean
    for cls in ("kn", "nb", "mi", "c1", "s2", "si", "o"):  # keywords, builtins, numbers, comments, strings
        assert f'<span class="{cls}">' in full and f'<span class="{cls}">' in lean, cls
    assert len(lean) < 0.75 * len(full)


def test_a_style_pygments_cannot_find_keeps_every_span() -> None:
    assert highlighted(True, {"pygments_dark_style": "no-such-style"}) == highlighted(False)


def test_the_website_drops_jupyterlabs_solution_folds_and_keeps_their_text() -> None:
    """A written solution, as tools/sync_notebooks.py folds it, parsed by MyST: the page holds its
    text once, without the "Show the solution" dropdown or the HTML around the solution-end fence."""
    from docutils.frontend import get_default_settings
    from docutils.utils import new_document
    from myst_parser.parsers.docutils_ import Parser

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from sync_notebooks import fold_written_solution

    source = fold_written_solution("Divide by $T$: the answer.\n\n:::{solution-end}\n:::")
    assert "Show the solution" in source and "attnbook-gate" in source
    source = source.replace(":::{solution-end}\n:::", "A paragraph in place of the fence.")
    parser = Parser()
    settings = get_default_settings(parser)
    settings.myst_enable_extensions = ["colon_fence", "dollarmath"]  # as _config.yml
    doc = new_document("page", settings)
    parser.parse(source, doc)
    before = doc.pformat()
    assert "Show the solution" in before and "attnbook-gate" in before
    attnbook_site.drop_lab_folds(None, doc)
    after = doc.pformat()
    assert "Show the solution" not in after and "attnbook-gate" not in after and "admonition" not in after
    assert after.count("Divide by") == 1 and "A paragraph in place of the fence." in after
